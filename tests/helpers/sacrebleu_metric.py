"""An offline stand-in for ``evaluate.load("sacrebleu")``, for tests that compare the package's scores with the
interface of evaluate's metric without the Hub. The package itself scores with ``evaluation.score``."""

from collections.abc import Sequence
from typing import Any

import sacrebleu

from vanilla_transformer.evaluation import check_texts


class LocalSacrebleuMetric:
    """Offline stand-in for ``evaluate.load("sacrebleu")``, computed by the ``sacrebleu`` package.

    ``compute(predictions=[...], references=[...])`` takes one reference string per prediction, or a
    list of references per prediction (the same number for each), and returns the keys of evaluate's
    metric: ``score``, ``counts``, ``totals``, ``precisions``, ``bp``, ``sys_len``, ``ref_len``.
    Keyword options are those of evaluate's metric (``smooth_method``, ``smooth_value``, ``force``,
    ``lowercase``, ``tokenize``, ``use_effective_order``).
    """

    name = "sacrebleu"

    def compute(
        self,
        *,
        predictions: Sequence[str],
        references: Sequence[str] | Sequence[Sequence[str]],
        smooth_method: str = "exp",
        smooth_value: float | None = None,
        force: bool = False,
        lowercase: bool = False,
        tokenize: str | None = None,
        use_effective_order: bool = False,
    ) -> dict:
        predictions = check_texts("predictions", predictions)
        references = list(references)
        if not references:
            raise ValueError("`references` is empty: give one reference (or list of references) per prediction.")
        if len(predictions) != len(references):
            raise ValueError(
                f"{len(predictions)} predictions but {len(references)} references: give one per prediction."
            )
        if isinstance(references[0], str):
            references = [[ref] for ref in references]
        per_prediction = len(references[0])
        if any(len(refs) != per_prediction for refs in references):
            raise ValueError("Sacrebleu requires the same number of references for each prediction")
        streams = [[refs[i] for refs in references] for i in range(per_prediction)]
        output = sacrebleu.corpus_bleu(
            predictions,
            streams,
            smooth_method=smooth_method,
            smooth_value=smooth_value,
            force=force,
            lowercase=lowercase,
            use_effective_order=use_effective_order,
            **({"tokenize": tokenize} if tokenize else {}),
        )
        return {
            "score": output.score,
            "counts": output.counts,
            "totals": output.totals,
            "precisions": output.precisions,
            "bp": output.bp,
            "sys_len": output.sys_len,
            "ref_len": output.ref_len,
        }


def load_sacrebleu_metric(use_hub: bool = True) -> Any:
    """``evaluate.load("sacrebleu")`` if it loads, else :class:`LocalSacrebleuMetric` (offline).

    ``evaluate.load`` fetches the metric's *script* from the Hugging Face Hub (or finds it in the
    local cache, ``~/.cache/huggingface``); it fails without network access or with
    ``HF_HUB_OFFLINE=1`` and no cached copy. Either way the returned object has
    ``compute(predictions=..., references=...)`` returning evaluate's keys (``"score"``, ...).
    ``use_hub=False`` skips ``evaluate`` (and so any network access) altogether. For scores with
    signatures, prefer :func:`score`.
    """
    if use_hub:
        try:
            import evaluate

            return evaluate.load("sacrebleu")
        except Exception:  # no network, offline mode, no cached script, a broken install...
            pass
    return LocalSacrebleuMetric()
