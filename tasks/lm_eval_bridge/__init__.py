"""lm-evaluation-harness integration (optional: `pip install -e '.[lm-eval]'`).

- `model.py`: `HarnessLM`, the lm-eval model `harness` (a subclass of lm-eval's `LM`) around
  a MixerLM checkpoint of any mixer: loglikelihood, loglikelihood_rolling, generate_until
  (greedy, decoding through the mixers' prefill/step).
- `export.py`: our tasks as lm-eval tasks over local JSONL (MQAR, NIAH, a cloze test of the
  tiny corpus's facts, perplexity on a corpus's validation paragraphs), so any model lm-eval
  can load, a Hugging Face model included, is scored on them offline.
- `task.py`: the harness task `lm-eval` behind `harness eval`: one run record per evaluation.

Only model.py and the body of the `lm-eval` task's run import lm_eval, so the rest of the
harness works without it.
"""

LM_EVAL_MISSING = "lm-evaluation-harness is not installed; install it with: pip install -e '.[lm-eval]'"


def lm_eval_available() -> bool:
    """True when the lm_eval package can be imported here."""
    import importlib.util

    return importlib.util.find_spec("lm_eval") is not None
