"""lm-eval's own command line with the harness model registered (`--model harness`).

    python -m tasks.lm_eval_bridge.export --out tasks_dir
    python -m harness.lm_eval run --model harness --model_args checkpoint=RUN/checkpoint \\
        --tasks harness_mqar --include_path tasks_dir --output_path out

Every lm-eval option works as in `lm_eval run`; this only imports the harness model first, so
lm-eval finds it by name. Hugging Face libraries stay offline unless HF_HUB_OFFLINE is set.
"""

from __future__ import annotations

import os
import sys


def main(argv: list[str] | None = None) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    try:
        from lm_eval.__main__ import cli_evaluate

        import tasks.lm_eval_bridge.model  # noqa: F401 - registers the "harness" model with lm-eval
    except ModuleNotFoundError as e:
        sys.exit(f"error: {e.name} is not installed; pip install -e '.[lm-eval]'")
    sys.argv = ["lm-eval", *(sys.argv[1:] if argv is None else argv)]
    cli_evaluate()


if __name__ == "__main__":
    main()
