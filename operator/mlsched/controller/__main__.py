"""`python -m mlsched.controller`: run the operator.

    python -m mlsched.controller [--namespace NS ...] [--port 8080] [--interval-scale 0.01]

Flags are also read from MLSCHED_* variables (see config.py); a flag wins. Without
--namespace the operator serves every namespace. With --leader-election, several replicas run
and only the holder of the Lease writes anything (controller/process/leadership.py); kopf peering is
not used (it pauses operators, it elects no leader).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys


def _byte_count(text: str) -> str:
    from mlsched.controller.process.config import parse_bytes

    try:
        parse_bytes(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text  # exported as written; config.py parses MLSCHED_MAX_MODEL_BYTES


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m mlsched.controller", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--namespace", "-n", action="append", default=[],
                   help="serve this namespace (repeatable; globs allowed); default: all")
    p.add_argument("--port", type=int, help="port of /v1/progress, /metrics, /healthz (8080)")
    p.add_argument("--interval-scale", type=float,
                   help="multiply every SchedulingPolicy's interval (e.g. 0.01 in tests)")
    p.add_argument("--job-sync-seconds", type=float,
                   help="how often each MLJob's lifecycle is re-evaluated (10)")
    p.add_argument("--scheduler-grace-seconds", type=float,
                   help="how long a placed pod may go without a word from its scheduler "
                        "before its job reports it (60)")
    p.add_argument("--creating-grace-seconds", type=float,
                   help="how long a bound pod may wait for its containers to be created while "
                        "the kubelet reports why it cannot (FailedMount) before its job "
                        "reports it (60)")
    p.add_argument("--progress-url", help="URL training pods report progress to")
    p.add_argument("--tls-cert", help="serve the endpoint over HTTPS with this certificate")
    p.add_argument("--tls-key", help="... and this key")
    p.add_argument("--tls-ca", help="the CA that signed --tls-cert, passed on to training pods")
    p.add_argument("--tls-secret", metavar="NAMESPACE/NAME",
                   help="serve HTTPS with the CA and certificate in this Secret, made if missing")
    p.add_argument("--training-service-account",
                   help="ServiceAccount of pods whose template names none (mlsched-training)")
    p.add_argument("--leader-election", metavar="NAMESPACE/NAME",
                   help="run as one of several replicas: only the holder of this Lease "
                        "schedules, the others stand by with warm caches")
    p.add_argument("--leader-identity",
                   help="this replica's name in the Lease (default: hostname and a random tag)")
    p.add_argument("--allowed-model-dir", action="append", default=[], metavar="DIR",
                   help="a directory SchedulingPolicy model paths may name files in (repeatable; "
                        "default: the models shipped with the operator)")
    p.add_argument("--max-model-bytes", metavar="BYTES", type=_byte_count,
                   help="largest model file, ConfigMap value or model card read, e.g. 64Mi (64Mi)")
    p.add_argument("--execution-provider", metavar="CPU|CUDA",
                   help="where learned policies' ONNX models run: CPU (default), or CUDA with "
                        "the gpu extra (onnxruntime-gpu) and a GPU")
    p.add_argument("--gpu-resource", metavar="NAME",
                   help="the accelerator's extended resource name the planner counts as GPUs "
                        "(nvidia.com/gpu; e.g. amd.com/gpu); its taint key is tolerated by default")
    p.add_argument("--gpu-device-class", action="append", default=[], metavar="CLASS",
                   help="a Dynamic Resource Allocation DeviceClass whose devices are GPUs: "
                        "claimed through it, they are planned as GPUs (repeatable; default "
                        "gpu.nvidia.com)")
    p.add_argument("--gpu-type-label", metavar="KEY",
                   help="the node label a node's GPU type is read from "
                        "(nvidia.com/gpu.product): products naming V100, P100 or K80 are "
                        "those types, for the type-aware policies and for a role's gpuTypes")
    p.add_argument("--max-exploration", type=float, metavar="EPSILON",
                   help="largest spec.exploration.epsilon served; above it, clamped (0.2)")
    p.add_argument("--label-nodes", action="store_true", default=None,
                   help="let SchedulingPolicies with spec.pools.mode LabelNodes label nodes with "
                        "mlsched.io/pool (needs the nodes patch rule of "
                        "manifests/overlays/label-nodes)")
    p.add_argument("--verbose", "-v", action="store_true", help="debug logging")
    p.add_argument("--log-format", choices=LOG_FORMATS,
                   default=os.environ.get("MLSCHED_LOG_FORMAT", "full"),
                   help="full: time, logger and level before each line (default); json: one "
                        "object a line, for a log collector; plain: the message alone")
    args = p.parse_args(argv)
    if args.log_format not in LOG_FORMATS:  # from the environment, which argparse does not check
        p.error(f"MLSCHED_LOG_FORMAT={args.log_format!r}: choose one of {', '.join(LOG_FORMATS)}")
    return args


# `kubectl logs` shows no time unless asked (--timestamps), and a line without its level hides
# a warning among a thousand INFO lines: `full` is the default, as Kueue's and Volcano's logs
# carry both.
LOG_FORMATS = ("full", "json", "plain")


def configure_logging(log_format: str, verbose: bool) -> None:
    import kopf

    kopf.configure(verbose=verbose, log_format=kopf.LogFormat[log_format.upper()])
    logging.getLogger("mlsched").setLevel(logging.DEBUG if verbose else logging.INFO)
    if not verbose:
        # kopf logs every successful handler and timer run at INFO: with a thousand jobs that
        # drowns the operator's own lines (which name the job), so only its problems show.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)


def export(args: argparse.Namespace) -> None:
    """Flags → MLSCHED_* variables, which handlers.py reads when imported."""
    flags = {"NAMESPACES": ",".join(args.namespace) or None, "PORT": args.port,
             "INTERVAL_SCALE": args.interval_scale, "JOB_SYNC_SECONDS": args.job_sync_seconds,
             "SCHEDULER_GRACE_SECONDS": args.scheduler_grace_seconds,
             "CREATING_GRACE_SECONDS": args.creating_grace_seconds,
             "OPERATOR_PROGRESS_URL": args.progress_url, "TLS_CERT": args.tls_cert,
             "TLS_KEY": args.tls_key, "TLS_CA": args.tls_ca, "TLS_SECRET": args.tls_secret,
             "TRAINING_SERVICE_ACCOUNT": args.training_service_account,
             "LEADER_ELECTION": args.leader_election, "LEADER_IDENTITY": args.leader_identity,
             "MAX_MODEL_BYTES": args.max_model_bytes, "MAX_EXPLORATION": args.max_exploration,
             "EXECUTION_PROVIDER": args.execution_provider, "GPU_RESOURCE": args.gpu_resource,
             "GPU_DEVICE_CLASSES": ",".join(args.gpu_device_class) or None,
             "GPU_TYPE_LABEL": args.gpu_type_label,
             "ALLOWED_MODEL_DIRS": os.pathsep.join(args.allowed_model_dir) or None,
             "LABEL_NODES": "true" if args.label_nodes else None}
    for name, value in flags.items():
        if value is not None:
            os.environ[f"MLSCHED_{name}"] = str(value)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    export(args)
    from mlsched.controller.process.config import OperatorConfig

    problems = OperatorConfig.from_env().problems()
    if problems:  # before kopf starts: a pod in CrashLoopBackOff whose log says why
        for problem in problems:
            print(f"python -m mlsched.controller: {problem}", file=sys.stderr)
        return 2
    import kopf

    import importlib

    importlib.import_module("mlsched.controller.app.handlers")  # registers the handlers
    from mlsched.controller.app.watched import CONFIG

    configure_logging(args.log_format, args.verbose)
    namespaces = CONFIG.namespaces
    if os.environ.get("MLSCHED_GC_TUNING", "1") != "0":  # "0": CPython's defaults (loop_health.py)
        from mlsched.controller.process.loop_health import tune_collector
        tune_collector()  # after the imports, which it freezes out of every later collection
    kopf.run(standalone=True, clusterwide=not namespaces, namespaces=namespaces)
    return 0


if __name__ == "__main__":
    sys.exit(main())
