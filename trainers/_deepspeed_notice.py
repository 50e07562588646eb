"""DeepSpeed's import-time notice, said in our words: with DeepSpeed installed (the ``[deepspeed]`` extra), importing
transformers makes DeepSpeed look for an accelerator and print ``[WARNING] ... Setting accelerator to CPU. If you
have GPU or other accelerator, we were unable to detect it.`` on stdout, into every run on a machine without a GPU.

On a CPU build of torch that is expected, and is logged at INFO; a CUDA build that sees no GPU is worth a WARNING
that says what to check. ``DS_ACCELERATOR`` (DeepSpeed's own setting) still chooses the accelerator."""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

NOTICE = "Setting accelerator to CPU"
"""How DeepSpeed's message starts (``deepspeed/accelerator/real_accelerator.py``)."""


class DeepSpeedCpuNotice(logging.Filter):
    """A filter on DeepSpeed's logger that replaces its CPU-accelerator notice with one line of ours."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.getMessage().startswith(NOTICE):
            return True
        import torch  # DeepSpeed has imported it by now

        if torch.version.cuda is None:
            logger.info(
                "no GPU in this torch build (CPU only): DeepSpeed uses its CPU accelerator and training runs on the CPU"
            )
        else:
            logger.warning(
                "torch is built for CUDA %s but sees no GPU, so DeepSpeed and training use the CPU; check "
                "CUDA_VISIBLE_DEVICES and the driver (nvidia-smi), or set DS_ACCELERATOR to choose an accelerator",
                torch.version.cuda,
            )
        return False


def install() -> None:
    """Put the filter on DeepSpeed's logger (before DeepSpeed is imported: it keeps the logger's filters)."""
    deepspeed_logger = logging.getLogger("DeepSpeed")
    if not any(isinstance(found, DeepSpeedCpuNotice) for found in deepspeed_logger.filters):
        deepspeed_logger.addFilter(DeepSpeedCpuNotice())
