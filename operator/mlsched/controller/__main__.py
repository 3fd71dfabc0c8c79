"""`python -m mlsched.controller`: run the operator.

    python -m mlsched.controller [--namespace NS ...] [--port 8080] [--interval-scale 0.01]

Flags are also read from MLSCHED_* variables (see config.py); a flag wins. Without
--namespace the operator serves every namespace. It runs standalone (no kopf peering): the
Deployment has one replica and the Recreate strategy, so two operators never run at once.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys


def _byte_count(text: str) -> str:
    from mlsched.controller.config import parse_bytes

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
    p.add_argument("--progress-url", help="URL training pods report progress to")
    p.add_argument("--tls-cert", help="serve the endpoint over HTTPS with this certificate")
    p.add_argument("--tls-key", help="... and this key")
    p.add_argument("--allowed-model-dir", action="append", default=[], metavar="DIR",
                   help="a directory SchedulingPolicy model paths may name files in (repeatable; "
                        "default: the models shipped with the operator)")
    p.add_argument("--max-model-bytes", metavar="BYTES", type=_byte_count,
                   help="largest model file, ConfigMap value or model card read, e.g. 64Mi (64Mi)")
    p.add_argument("--verbose", "-v", action="store_true", help="debug logging")
    return p.parse_args(argv)


def export(args: argparse.Namespace) -> None:
    """Flags → MLSCHED_* variables, which handlers.py reads when imported."""
    flags = {"NAMESPACES": ",".join(args.namespace) or None, "PORT": args.port,
             "INTERVAL_SCALE": args.interval_scale, "JOB_SYNC_SECONDS": args.job_sync_seconds,
             "OPERATOR_PROGRESS_URL": args.progress_url, "TLS_CERT": args.tls_cert,
             "TLS_KEY": args.tls_key, "MAX_MODEL_BYTES": args.max_model_bytes,
             "ALLOWED_MODEL_DIRS": os.pathsep.join(args.allowed_model_dir) or None}
    for name, value in flags.items():
        if value is not None:
            os.environ[f"MLSCHED_{name}"] = str(value)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    export(args)
    import kopf

    from mlsched.controller import handlers  # registers the handlers  # noqa: F401

    kopf.configure(verbose=args.verbose, log_format=kopf.LogFormat.PLAIN)
    logging.getLogger("mlsched").setLevel(logging.DEBUG if args.verbose else logging.INFO)
    if not args.verbose:
        # kopf logs every successful handler and timer run at INFO: with a thousand jobs that
        # drowns the operator's own lines (which name the job), so only its problems show.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    namespaces = handlers.CONFIG.namespaces
    kopf.run(standalone=True, clusterwide=not namespaces, namespaces=namespaces)
    return 0


if __name__ == "__main__":
    sys.exit(main())
