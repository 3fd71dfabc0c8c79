"""`mlsched retrain dl2`: improve the active DL² model from the cluster's interval records.

    mlsched retrain dl2 --namespace NS --policy NAME [--mode simulator|imitate|offpolicy]  # in the cluster
    mlsched retrain dl2 --records DIR --store DIR [--mode ...]                        # local files
    python -m policy_models.retrain.cli ...                                           # the same

1. Read the records not yet consumed: intervals after the newest published version's
   `trained_through_interval` (nothing new: say so and stop).
2. Calibrate the simulator's per-model speeds to them (calibration.py).
3. Start from the active model (status.activeModels, else the newest published version, else
   the shipped one; --base-model overrides) and train: `simulator` continues RL in the
   calibrated simulator on the recorded workload; `imitate` imitates the relative-oracle
   teacher, given the calibrated speeds, there (with DAgger; imitate.py); `offpolicy`
   fine-tunes on the recorded decisions themselves.
4. Evaluate candidate against active on held-out traces of the recorded workload in the
   calibrated simulator; publish the candidate as the next version only if its average JCT
   is lower by --margin (a ConfigMap; never an edit of the SchedulingPolicy).
--out DIR (or --dry-run) writes the candidate, calibration, evaluation and the ConfigMap it
would create to DIR instead of publishing. docs/retraining.md has the details.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from mlsched.formats import model_versions
from mlsched.policies.decision_log import IntervalRecord
from mlsched.policies.onnx_runner import default_model_path
from policy_models.dl2 import export
from policy_models.retrain import (
    calibration, evaluate, imitate, kube_io, offpolicy, publish, simtrain, warm_start, workload,
)
from policy_models.retrain.history import read_record_dir

PHASE, ALGORITHM = "allocation", "dl2"
MODES = ("simulator", "imitate", "offpolicy")


def common_parser(prog: str, doc: str | None) -> argparse.ArgumentParser:
    """The options every retrainer takes (where records and versions are, the margin, budget,
    evaluation, calibration, seed, output); each adds its own."""
    p = argparse.ArgumentParser(prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--namespace", default=os.environ.get("POD_NAMESPACE", "default"))
    p.add_argument("--policy", default="default", help="the SchedulingPolicy whose records to learn from")
    p.add_argument("--records", help="read records from this directory instead of the cluster")
    p.add_argument("--store", help="published versions in this directory instead of the cluster")
    p.add_argument("--base-model", help="start from this ONNX model instead of the active one")
    p.add_argument("--margin", type=float, default=0.02,
                   help="publish only if avg JCT is lower by this fraction; a negative margin also publishes a "
                        "candidate up to that much worse (tests of the publishing path, a forced promotion)")
    p.add_argument("--time-budget-min", type=float, default=10.0, help="training time (evaluation comes after)")
    p.add_argument("--eval-traces", type=int, default=6)
    p.add_argument("--min-samples", type=int, default=5, help="calibration: fewer samples keep the prior")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", help="write the candidate here and publish nothing")
    p.add_argument("--dry-run", action="store_true", help="publish nothing (with no --out: a temporary directory)")
    return p


def parse_common(p: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    a = p.parse_args(argv)
    if not -1 < a.margin < 1:
        p.error("--margin must be in (-1, 1)")
    return a


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = common_parser("mlsched retrain dl2", __doc__)
    p.add_argument("--mode", choices=MODES, default="simulator")
    p.add_argument("--episodes", type=int, default=100_000, help="simulator mode: at most this many episodes")
    p.add_argument("--policy-epochs", type=int, default=4, help="offpolicy mode: passes over the records")
    return parse_common(p, argv)


def _write_model(directory: Path, onnx: bytes, card_json: str, algorithm: str = ALGORITHM) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{algorithm}.onnx"
    path.write_bytes(onnx)
    (directory / f"{algorithm}.card.json").write_text(card_json)
    return path


def base_model(a, store, policy_obj: dict | None, work: Path, phase: str = PHASE,
               algorithm: str = ALGORITHM) -> tuple[Path, int | None]:
    """(path of the model to start from and compare against, its published version or None):
    --base-model, else what the policy serves (status.activeModels), else the newest published
    version, else the shipped model."""
    if a.base_model:
        return Path(a.base_model), None
    by_sha = {}
    for cm in store.configmaps() if store else []:
        v = model_versions.parse(cm)
        if v is not None and (v.phase, v.algorithm) == (phase, algorithm):
            by_sha[v.sha256] = (v, cm)
    shipped = default_model_path(algorithm)
    active = kube_io.active_sha256(policy_obj, phase, algorithm) if policy_obj else None
    if active and active not in by_sha:
        if active == hashlib.sha256(shipped.read_bytes()).hexdigest():
            return shipped, None
        raise ValueError(f"the policy serves {algorithm} model {active[:12]}…, which is neither a published "
                         "version nor the shipped model: pass it with --base-model")
    if active is None and by_sha:
        active = max(by_sha.items(), key=lambda kv: kv[1][0].version)[0]
    if active is None:
        return shipped, None
    version, cm = by_sha[active]
    return _write_model(work / "base", *publish.model_bytes(store, cm, algorithm), algorithm), version.version


def sources(a) -> tuple[list[IntervalRecord], object | None, dict | None]:
    """(the records, the store of published versions, the SchedulingPolicy object) from local
    directories (--records, --store) or the cluster (the Job's ServiceAccount)."""
    core = custom = policy_obj = None
    if not (a.records and (a.store or a.out or a.dry_run)):
        core, custom = kube_io.clients()
        policy_obj = kube_io.scheduling_policy(custom, a.namespace, a.policy)
    records = read_record_dir(a.records) if a.records else kube_io.list_records(core, a.namespace, a.policy)
    store = (publish.DirStore(a.store, a.policy) if a.store
             else kube_io.KubeStore(core, a.namespace, a.policy) if core is not None else None)
    return records, store, policy_obj


def new_intervals(records: list[IntervalRecord], versions, phase: str, algorithm: str,
                  log=print) -> tuple[list[IntervalRecord], tuple[int | None, int | None]]:
    """(the records no published version of phase/algorithm consumed, their first and last
    interval); with none, (the last interval consumed) as the second."""
    fresh = publish.unconsumed(records, versions, phase, algorithm)
    if not fresh:
        mark = publish.trained_through(versions, phase, algorithm)
        log(f"nothing new: every recorded interval (up to {mark}) was consumed by a published version")
        return [], (None, mark)
    span = (min(r.interval for r in fresh), max(r.interval for r in fresh))
    log(f"{len(fresh)} new intervals ({span[0]}-{span[1]}); {len(records) - len(fresh)} consumed before")
    return fresh, span


def progress_warnings(fresh: list[IntervalRecord], log=print) -> list[str]:
    """Say so when no job in the records trained anything: every job-interval at 0 epochs and
    no measured speed (training programs that never call mlsched.progress, or intervals closed
    before any report). Retraining then runs on nothing but the priors: the calibration keeps
    them, every reward is 0, and a "candidate" comes out all the same, which used to pass
    without a word. Logged at once and returned for the run's report."""
    jobs = [j for r in fresh for j in r.jobs]
    if any(j.epochs > 0 or j.speed for j in jobs):
        return []
    span = f"{min(r.interval for r in fresh)}-{max(r.interval for r in fresh)}"
    if not jobs:
        text = f"no progress recorded: the {len(fresh)} intervals ({span}) hold no job"
    else:
        text = (f"no progress recorded: none of the {len(jobs)} job-intervals in the {len(fresh)} "
                f"intervals ({span}) trained any epoch or reported a speed, so the calibration "
                f"keeps its priors and every reward is 0: this run learns nothing from the "
                f"cluster. Do the jobs' programs report progress (mlsched.progress, "
                f"docs/training.md)?")
    log(f"WARNING: {text}")
    return [text]


def calibrate(fresh: list[IntervalRecord], versions, phase: str, algorithm: str, min_samples: int,
              log=print) -> calibration.Calibration:
    """Speed and sensitivity factors from the new records, the newest published version's as
    the prior."""
    newest = model_versions.newest(versions, phase, algorithm)
    prior = (newest.evaluation.get("speed_factors") if newest else None) or None
    sensitivity = (newest.evaluation.get("sensitivity_factors") if newest else None) or None
    cal = calibration.calibrate(fresh, prior=prior, min_samples=min_samples, sensitivity_prior=sensitivity)
    log("calibrated speed factors: " + json.dumps(cal.speed_factors))
    log("calibrated interference sensitivity factors: " + json.dumps(cal.sensitivity_factors)
        + (f" (too little evidence, prior kept: {', '.join(cal.sensitivity_kept_prior)})"
           if cal.sensitivity_kept_prior else ""))
    log(calibration.cost_line(cal))
    return cal


def run(a, log=print) -> dict:
    t0 = time.time()
    torch.set_num_threads(1)
    rng = np.random.default_rng(a.seed)
    records, store, policy_obj = sources(a)
    versions = store.versions() if store else []
    fresh, span = new_intervals(records, versions, PHASE, ALGORITHM, log)
    if not fresh:
        return {"status": "nothing-new", "trained_through_interval": span[1]}
    warnings = progress_warnings(fresh, log)

    work = Path(a.out) if a.out else Path(tempfile.mkdtemp(prefix="mlsched-retrain-"))
    base_path, base_version = base_model(a, store, policy_obj, work)
    cal = calibrate(fresh, versions, PHASE, ALGORITHM, a.min_samples, log)
    load = workload.from_records(fresh)

    net, card = warm_start.load(base_path, seed=a.seed)
    spec = warm_start.network_args(card)
    budget = a.time_budget_min * 60
    if a.mode == "simulator":
        summary = simtrain.train_in_simulator(
            net, spec, load, cal,
            simtrain.SimRLArgs(time_budget_s=budget, episodes=a.episodes), a.seed, log)
    elif a.mode == "imitate":
        summary = imitate.imitate_in_simulator(
            net, spec, load, cal, imitate.ImitateArgs(time_budget_s=budget), a.seed, log)
    else:
        steps = offpolicy.transitions(fresh, card, offpolicy.OffPolicyArgs.gamma)
        summary = offpolicy.fine_tune(net, steps, offpolicy.OffPolicyArgs(time_budget_s=budget,
                                                                          policy_epochs=a.policy_epochs), rng, log)
    candidate = work / "candidate" / f"{ALGORITHM}.onnx"
    training = {"command": " ".join(["mlsched retrain dl2", *sys.argv[1:]]), "mode": a.mode,
                "base_sha256": card.onnx_sha256, "base_version": base_version, "intervals": list(span),
                "seed": a.seed, "summary": summary, "calibration": cal.to_json(), "workload": load.to_json()}
    cases = [(load.trace(workload.EVALUATION_SEEDS + k), load.config(workload.EVALUATION_SEEDS + k, cal))
             for k in range(a.eval_traces)]
    domain = load.widened_domain(card.domain, len(fresh))
    export.export(net, spec, candidate, phase=f"retrain-{a.mode}", training=training, validation={},
                  domain=domain)
    judged = evaluate.compare(str(base_path), str(candidate), cases)
    evaluation = {**judged, "mode": a.mode, "margin": a.margin, "trained_through_interval": span[1],
                  "first_interval": span[0], "intervals": len(fresh), "base_version": base_version,
                  "base_sha256": card.onnx_sha256, "speed_factors": cal.speed_factors,
                  "sensitivity_factors": cal.sensitivity_factors, "restart_cost_s": cal.restart_cost_s,
                  "start_cost_s": cal.start_cost_s, "seed": a.seed}
    # The card carries the evaluation too (re-exported: the graph's bytes do not change).
    card_json = json.dumps(export.export(net, spec, candidate, phase=f"retrain-{a.mode}", training=training,
                                         validation={"retrain_evaluation": evaluation}, domain=domain),
                           indent=1, sort_keys=True)
    return conclude(a, work, store, versions, PHASE, ALGORITHM, candidate, card_json, evaluation, cal, t0, log,
                    warnings)


def conclude(a, work: Path, store, versions, phase: str, algorithm: str, candidate: Path, card_json: str,
             evaluation: dict, cal, t0: float, log=print, warnings: list[str] = ()) -> dict:
    """_conclude, with the run's warnings in its report (the Job log's last line) and again as
    the last lines of stderr, where a reader of a long log looks."""
    report = _conclude(a, work, store, versions, phase, algorithm, candidate, card_json, evaluation, cal,
                       t0, log)
    if warnings:
        report["warnings"] = list(warnings)
        for text in warnings:
            log(f"WARNING: {text}")
    return report


def _conclude(a, work: Path, store, versions, phase: str, algorithm: str, candidate: Path, card_json: str,
              evaluation: dict, cal, t0: float, log=print) -> dict:
    """The end of every retrainer's run: judge the candidate by the margin; with --out or
    --dry-run (or no store), write its calibration, evaluation and the ConfigMap it would be
    (with its parts, for a large model) to `work`; otherwise publish it if it is better (once: a rerun finds it already published)."""
    onnx = candidate.read_bytes()
    better = evaluate.better_by(evaluation, a.margin)
    log(f"candidate / active avg JCT on {evaluation['traces']} held-out traces: {evaluation['ratio']:.4f} "
        f"({'better' if better else 'not better'} by the margin {a.margin:g})")
    report = {"status": "not-better", "evaluation": evaluation, "candidate": str(candidate),
              "wall_s": round(time.time() - t0, 1)}
    if a.out or a.dry_run or store is None:
        cal.write(work / "calibration.json")
        (work / "evaluation.json").write_text(json.dumps(evaluation, indent=1, sort_keys=True))
        version = model_versions.next_version(versions, phase, algorithm)
        parts = model_versions.part_manifests(a.namespace, a.policy, algorithm, onnx, card_json)
        manifest = model_versions.manifest(a.namespace, a.policy, phase, algorithm, version, onnx, card_json,
                                           evaluation, parts)
        # A model over one ConfigMap: a List, its parts before the version (`kubectl create -f`
        # creates them in order, as publishing does).
        doc = {"apiVersion": "v1", "kind": "List", "items": [*parts, manifest]} if parts else manifest
        (work / "configmap.json").write_text(json.dumps(doc, indent=1, sort_keys=True))
        report["status"] = "dry-run" if better else "not-better"
        log(f"wrote the candidate and the ConfigMap it would publish to {work}")
        return report
    if better:
        published, created = publish.publish(store, a.namespace, a.policy, phase, algorithm, onnx, card_json, evaluation)
        report.update(status="published" if created else "already-published", version=published.version,
                      configmap=published.configmap)
        log(f"{'published' if created else 'already published as'} {published.configmap} (version {published.version})")
    return report


def main(argv: list[str] | None = None, run=run, parse_args=parse_args) -> int:
    """A retrainer's command: progress on stderr, the JSON report last on stdout (what the Job's
    log ends with). `mlsched retrain harmony` passes its own run and parse_args."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    report = run(parse_args(argv), log=lambda m: print(m, file=sys.stderr))
    print(json.dumps(report, sort_keys=True))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
