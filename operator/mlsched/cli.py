"""`mlsched` command line: simulate, train, retrain, trace generate, model-configmap."""

from __future__ import annotations

import argparse
import json
import sys
from importlib import resources as importlib_resources

DEFAULT_POLICIES = "drf,fifo,srtf,tetris,optimus,optimus-oracle,dl2"
DEFAULT_TRACE = "default-trace.csv"


def _csv(text: str) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise argparse.ArgumentTypeError("expected a comma-separated list")
    return items


def _positive(kind):
    def parse(text: str):
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value
    return parse


def _add_cluster_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nodes", type=_positive(int), default=13, help="number of nodes (default 13, the DL² testbed)")
    p.add_argument("--node-cpus", type=_positive(float), default=8)
    p.add_argument("--node-gpus", type=float, default=2)
    p.add_argument("--node-mem-gib", type=_positive(float), default=48)
    p.add_argument("--interval", type=_positive(float), default=1200.0, help="scheduling interval in seconds")
    p.add_argument("--max-ps", type=_positive(int), default=16)
    p.add_argument("--max-workers", type=_positive(int), default=16)
    p.add_argument("--scaling-cost", type=float, default=None,
                   help="seconds a job loses when its tasks change (checkpoint-restart ~30; hot scaling "
                        "~0.05); default: the --speed-calibration file's measured restart and start "
                        "costs where it has them (`mlsched retrain` writes them), else 30")
    p.add_argument("--speed-model", default="measured", choices=["measured", "optimus-fit"])
    p.add_argument("--no-interference", action="store_true", help="ignore co-location interference")
    p.add_argument("--admission", default="arrival", choices=["interval", "arrival"],
                   help="arrival (default): jobs get tasks at slot starts and also when a job arrives "
                        "or one finishes, by an admission step, as the operator does; interval: only "
                        "at slot starts (the papers' rule)")
    p.add_argument("--speed-calibration", metavar="FILE",
                   help="scale each model's speed (and its interference sensitivity) by a calibration's "
                        "factors (the JSON `mlsched retrain` writes: {\"speed_factors\": {model: factor}, "
                        "\"sensitivity_factors\": {model: factor}}); default: the catalog's speeds")
    p.add_argument("--no-grouping-guard", action="store_true",
                   help="run harmony grouping's search alone, not compared at each arrival with isolated "
                        "and none by rollouts (docs/grouping.md, \"Never worse than its baselines\")")
    p.add_argument("--placement-rollout", action="store_true",
                   help="judge harmony placement at each arrival against LIF-Line by rollouts to the end "
                        "under sampled futures, the network served only where it wins every one (4-55 x "
                        "the simulator time; docs/placement.md, \"The guard\"); default: its per-round guard only")
    p.add_argument("--seed", type=int, default=0)


def _calibration(path: str | None) -> tuple[dict[str, float] | None, dict[str, float] | None, dict]:
    """(speed factors, sensitivity factors, the SimConfig cost fields) of a calibration file;
    (None, None, {}) without one. The costs are those `mlsched retrain` measured (format
    version 3, policy_models/retrain/calibration.py Calibration.sim_costs): real seconds, so
    paid in full past a slot's end; none in a file without a measured restart cost."""
    if not path:
        return None, None, {}
    with open(path) as f:
        doc = json.load(f)
    factors = doc.get("speed_factors") if isinstance(doc, dict) else None
    if not isinstance(factors, dict):
        raise ValueError(f"{path}: no speed_factors object (a calibration from `mlsched retrain` expected)")
    sensitivity = doc.get("sensitivity_factors") or {}  # a version-1 calibration has none
    if not isinstance(sensitivity, dict):
        raise ValueError(f"{path}: sensitivity_factors must be an object of model: factor")
    costs = {}
    restart, start = doc.get("restart_cost_s"), doc.get("start_cost_s")
    if restart is not None:
        if not isinstance(restart, (int, float)) or restart < 0 or not (
                start is None or isinstance(start, (int, float)) and start >= 0):
            raise ValueError(f"{path}: restart_cost_s and start_cost_s must be seconds >= 0 (or null)")
        costs = {"scaling_cost_s": float(restart), "start_cost_s": None if start is None else float(start),
                 "costs_span_slots": True}
    return ({str(m): float(v) for m, v in factors.items()},
            {str(m): float(v) for m, v in sensitivity.items()} or None, costs)


def _config(args):
    from mlsched.sim.simulator import SimConfig

    speed_factors, sensitivity_factors, costs = _calibration(args.speed_calibration)
    if args.scaling_cost is not None or not costs:  # given by hand: it alone, as before
        costs = {"scaling_cost_s": 30.0 if args.scaling_cost is None else args.scaling_cost}
    return SimConfig(nodes=args.nodes, node_cpus=args.node_cpus, node_gpus=args.node_gpus,
                     node_mem_gib=args.node_mem_gib, interval_s=args.interval, max_ps=args.max_ps,
                     max_workers=args.max_workers, **costs,
                     speed_model=args.speed_model, interference=not args.no_interference, seed=args.seed,
                     admission=args.admission, speed_factors=speed_factors,
                     sensitivity_factors=sensitivity_factors,
                     grouping_guard=not args.no_grouping_guard,
                     placement_rollout=args.placement_rollout)


def cmd_simulate(args) -> int:
    from tqdm import tqdm

    from mlsched.policies.regret_guard import GuardSpec
    from mlsched.sim import compare
    from mlsched.workloads import traces

    if args.trace:
        trace = traces.read(args.trace)
        source = args.trace
    else:
        text = importlib_resources.files("mlsched.workloads").joinpath("data", DEFAULT_TRACE).read_text()
        trace = traces.parse(text, f"<built-in {DEFAULT_TRACE}>")
        source = f"built-in {DEFAULT_TRACE}"
    config = _config(args)
    if args.gpu_types:  # one type per node (workloads/gpu_types.py)
        from dataclasses import replace

        from mlsched.workloads import gpu_types

        types = gpu_types.parse_cluster(args.gpu_types)
        config = replace(config, nodes=len(types), gpu_types=types)
        args.nodes = len(types)
        from mlsched.policies.registry import TYPE_AWARE_PLACEMENT, type_blind_pairs

        for allocation, placement in type_blind_pairs(args.policies, args.placement):
            print(f"mlsched: warning: {allocation} with --placement {placement}: its workers may "
                  f"spread over GPU types and run at the slowest one's pace; it is meant to run "
                  f"with --placement {TYPE_AWARE_PLACEMENT[allocation]}", file=sys.stderr)
    if args.quota:  # all the jobs' requests together, as a namespace's ResourceQuota
        from dataclasses import replace

        from mlsched.sim import quota

        config = replace(config, quota=quota.parse(args.quota))
    if args.decided_once:
        from dataclasses import replace

        config = replace(config, served_round=False)
    total = len(trace) * len(args.policies) * len(args.placement) * len(args.grouping)
    with tqdm(total=total, desc="simulating", unit="job", file=sys.stderr, disable=None, leave=False) as bar:
        runs = compare.run_pairs(trace, config, args.policies, args.placement,
                                 model_path=args.model, progress=bar.update, groupings=args.grouping,
                                 placement_model_path=args.placement_model,
                                 guard=GuardSpec.parse(args.guard) if args.guard else None,
                                 fallback=args.fallback)
    if args.plot:
        from mlsched.sim.plot import plot_jct

        plot_jct(runs, args.plot, title=f"{len(trace)} jobs on {args.nodes} nodes")
    if args.json:
        print(json.dumps({"trace": source, "nodes": args.nodes, "results": [r.row() for r in runs]}))
    else:
        print(f"trace: {source} ({len(trace)} jobs), cluster: {args.nodes} nodes x "
              f"({args.node_cpus:g} CPU, {args.node_gpus:g} GPU, {args.node_mem_gib:g} GiB), "
              f"interval {args.interval:g}s, seed {args.seed}")
        print(compare.format_table(runs))
        if args.plot:
            print(f"plot written to {args.plot}")
    return 0


def cmd_trace_generate(args) -> int:
    from mlsched.workloads import generators, traces

    jobs = generators.generate(jobs=args.jobs, rate=args.rate, pattern=args.pattern, seed=args.seed,
                               interval_s=args.interval, models=tuple(args.models) if args.models else None,
                               median_minutes=args.median_minutes, sigma=args.sigma,
                               arch_mix=args.allreduce_fraction)
    if args.out == "-":
        sys.stdout.write(traces.dumps(jobs))
    else:
        traces.write(jobs, args.out)
        print(f"wrote {len(jobs)} jobs to {args.out}", file=sys.stderr)
    return 0


def cmd_train(args, group: str = "mlsched.trainers", what: str = "trainer") -> int:
    """Dispatch to a trainer registered under the `mlsched.trainers` entry-point group (or a
    retrainer under `mlsched.retrainers`: `mlsched retrain dl2`)."""
    import os
    from importlib.metadata import entry_points

    trainers = {e.name: e for e in entry_points(group=group)}
    if args.policy not in trainers:
        raise ValueError(f"no {what} for {args.policy!r}; available: {', '.join(sorted(trainers)) or 'none'}")
    # Rollouts run many tiny matrix products: one BLAS thread is faster than several.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    try:
        trainer = trainers[args.policy].load()
    except ImportError as exc:
        raise ValueError(f"training needs the `train` extra (torch, onnx): "
                         f"pip install -e '.[train]'  ({exc})") from None
    return trainer(args.trainer_args)


def model_configmaps(name: str, key: str, model: bytes, card: bytes,
                     part_bytes: int | None = None) -> list[dict]:
    """The ConfigMaps that serve `model` as `configMapKeyRef: {name, key}`, its card on the
    key beside it: one ConfigMap when both fit, else the model in parts `<name>-part-<k>`
    before `name`, which names them (model_sources.MODEL_PARTS)."""
    import base64
    from pathlib import Path

    from mlsched.formats.dataset_store import PART_BYTES
    from mlsched.formats.model_sources import model_pieces, parts_annotation
    from mlsched.features.card import card_path

    card_key = card_path(Path(key)).name

    def configmap(cm_name: str, model_bytes: bytes | None, annotations: dict | None = None) -> dict:
        body: dict = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": cm_name}}
        if annotations:
            body["metadata"]["annotations"] = annotations
        if model_bytes is not None:
            body["binaryData"] = {key: base64.b64encode(model_bytes).decode("ascii")}
        return body

    def with_card(body: dict) -> dict:  # text in data, as `kubectl create configmap --from-file` puts it
        return {**body, "data": {card_key: card.decode()}}

    pieces = model_pieces(model, card, part_bytes or PART_BYTES)
    if not pieces:
        return [with_card(configmap(name, model))]
    parts = [configmap(f"{name}-part-{k}", chunk) for k, chunk in enumerate(pieces, 1)]
    named = parts_annotation(key, model, [p["metadata"]["name"] for p in parts])
    return [*parts, with_card(configmap(name, None, named))]


def cmd_model_configmap(args) -> int:
    from pathlib import Path

    from mlsched.features.card import card_path

    model_file = Path(args.model)
    card_file = Path(args.card) if args.card else card_path(model_file)
    if not card_file.is_file():
        raise ValueError(f"no model card {card_file}: a model serves with its card (the exporters write "
                         "it beside the model; name another with --card)")
    items = model_configmaps(args.name, args.key, model_file.read_bytes(), card_file.read_bytes())
    print(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}, indent=1))
    if len(items) > 1:
        print(f"mlsched: {model_file} is over one ConfigMap: {len(items) - 1} parts, then {args.name} naming them",
              file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mlsched", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    sim = sub.add_parser("simulate", help="compare scheduling policies on a trace in the simulator")
    sim.add_argument("--trace", help="trace CSV (name,arrival_s,model,epochs[,arch,workers,ps]); default: built-in")
    sim.add_argument("--policies", type=_csv, default=_csv(DEFAULT_POLICIES),
                     help=f"allocation policies, comma-separated (default {DEFAULT_POLICIES})")
    sim.add_argument("--placement", type=_csv, default=["load-balance"],
                     help="placement policies, comma-separated (load-balance, bin-pack, first-fit, tetris)")
    sim.add_argument("--grouping", type=_csv, default=["none"],
                     help="grouping policies, comma-separated (none, isolated, naive, harmony; "
                          "docs/grouping.md); every one runs with every allocation and placement")
    sim.add_argument("--model", help="ONNX model for a learned allocation policy (default: the shipped artifact)")
    sim.add_argument("--placement-model", help="ONNX model for a learned placement, e.g. harmony "
                                               "(default: the shipped artifact)")
    sim.add_argument("--guard", metavar="THRESHOLD:WINDOW",
                     help="a regret guard on learned policies, e.g. 10%%:6: at every interval the "
                          "latest WINDOW (a rolling window) are replayed under the learned policy and "
                          "--fallback, and the fallback serves while it is ahead by more than "
                          "THRESHOLD (docs/operator.md)")
    sim.add_argument("--fallback", default="drf", help="the guard's fallback allocation (default drf)")
    sim.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    sim.add_argument("--plot", help="write a JCT plot (PNG) to this path")
    sim.add_argument("--gpu-types", metavar="TYPE:NODES,...",
                     help="a heterogeneous cluster, nodes per GPU type in node order, e.g. "
                          "v100:4,p100:4,k80:4 (its total replaces --nodes; types: v100, p100, k80; "
                          "docs/simulator.md, GPU types); default: untyped, every GPU the same")
    sim.add_argument("--quota", metavar="cpu=N,gpu=N,mem=GIB",
                     help="a namespace quota on all the jobs' requests together, as a ResourceQuota "
                          "bounds them in the cluster, e.g. cpu=32,gpu=8 (a resource left out is "
                          "unbounded); default: none")
    sim.add_argument("--decided-once", action="store_true",
                     help="decide every round once, heuristic ones included, the rule of the figures "
                          "measured before 30 Nov 2026's served round; default: as the operator serves "
                          "them, heuristic rounds settled (docs/simulator.md, \"The served round\")")
    _add_cluster_args(sim)
    sim.set_defaults(func=cmd_simulate)

    # `mlsched train dl2 --help` reaches the trainer: past the policy, every argument is its own.
    train = sub.add_parser("train", help="train a learned policy in the simulator (needs the train extra)",
                           description="Train a learned policy in the simulator; `mlsched train POLICY "
                                       "--help` lists that trainer's options.")
    train.add_argument("policy", help="which policy to train, e.g. dl2")
    train.add_argument("trainer_args", nargs=argparse.REMAINDER, help="options of that trainer (--help lists them)")
    train.set_defaults(func=cmd_train)

    retrain = sub.add_parser("retrain",
                             help="improve a learned policy from the cluster's interval records and publish it "
                                  "if it wins (needs the train extra; docs/retraining.md)",
                             description="Improve a learned policy from the cluster's interval records and "
                                         "publish it if it wins; `mlsched retrain POLICY --help` lists that "
                                         "retrainer's options.")
    retrain.add_argument("policy", help="which learned algorithm to retrain, e.g. dl2")
    retrain.add_argument("trainer_args", nargs=argparse.REMAINDER, help="its options (--help lists them)")
    retrain.set_defaults(func=lambda a: cmd_train(a, "mlsched.retrainers", "retrainer"))

    cm = sub.add_parser("model-configmap", help="print the ConfigMap(s) serving an ONNX model and its card as "
                                                "configMapKeyRef {name, key}, split over several past 1 MiB "
                                                "(| kubectl create -n NS -f -)")
    cm.add_argument("name", help="the ConfigMap the reference names")
    cm.add_argument("model", help="the .onnx file")
    cm.add_argument("--card", help="its model card (default: <stem>.card.json beside it)")
    cm.add_argument("--key", default="policy.onnx", help="the key the reference names (default policy.onnx)")
    cm.set_defaults(func=cmd_model_configmap)

    trace = sub.add_parser("trace", help="work with trace files")
    tsub = trace.add_subparsers(dest="trace_command", required=True)
    gen = tsub.add_parser("generate", help="write a seeded synthetic trace as CSV")
    gen.add_argument("--jobs", type=_positive(int), default=60)
    gen.add_argument("--rate", type=_positive(float), default=3.0, help="mean arrivals per interval")
    gen.add_argument("--pattern", default="poisson", choices=["poisson", "uniform", "google"])
    gen.add_argument("--interval", type=_positive(float), default=1200.0)
    gen.add_argument("--models", type=_csv, help="model types to draw from (default: all)")
    gen.add_argument("--median-minutes", type=_positive(float), default=80.0,
                     help="median job length alone at 1 PS + 1 worker")
    gen.add_argument("--sigma", type=_positive(float), default=1.0, help="log-normal spread of job lengths")
    gen.add_argument("--allreduce-fraction", type=float, default=0.0)
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--out", default="-", help="output CSV path (default: stdout)")
    gen.set_defaults(func=cmd_trace_generate)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, OSError) as exc:  # bad input: one clear line, no traceback
        print(f"mlsched: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
