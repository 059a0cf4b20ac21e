"""Make our models, devices, predictor and scheduler known to Vidur: explicitly, idempotently.

Vidur discovers model and SKU configs by walking subclasses and predictors/schedulers through
registries; nothing in this package does either at import. Its entities also number themselves
with class-level counters, which :func:`reset_entity_ids` rewinds between simulations.
"""

from __future__ import annotations

import logging

from gpu_simulate_test.config.schema import HardwareConfig, ModelConfig
from gpu_simulate_test.vidur_simulate.devices import DeviceChoice, register_device
from gpu_simulate_test.vidur_simulate.models import register_qwen3_models, vidur_model_name
from gpu_simulate_test.vidur_simulate.predictor import register_predictor
from gpu_simulate_test.vidur_simulate.schedulers import register_schedulers

VIDUR_LOG_LEVEL = logging.WARNING


def register_vidur_extensions(
    model: ModelConfig, hardware: HardwareConfig
) -> tuple[str, DeviceChoice]:
    """Register everything a simulation of ``model`` on ``hardware`` needs; safe to call again.

    Returns the Vidur model name and the device/node SKUs to put in the replica config.
    """
    register_qwen3_models()
    register_predictor()
    register_schedulers()
    quiet_vidur_logging()
    return vidur_model_name(model), register_device(hardware)


def quiet_vidur_logging(level: int = VIDUR_LOG_LEVEL) -> None:
    """Vidur logs INFO to stdout (a percentile table per trace load); keep warnings only."""
    for name in [n for n in logging.root.manager.loggerDict if n.startswith("vidur")]:
        logging.getLogger(name).setLevel(level)
    logging.getLogger("vidur").setLevel(level)


def reset_entity_ids() -> None:
    """Rewind Vidur's class-level id counters (``Request``, ``Batch``, ``Replica``, ...).

    ``BaseEntity.generate_id`` does ``cls._id += 1`` per class, so a second simulation in the
    same process would number its replica 1 and crash (round-robin routes to replica 0), and
    request ids would continue from the previous run.
    """
    from vidur.config.utils import get_all_subclasses
    from vidur.entities.base_entity import BaseEntity

    for cls in [BaseEntity, *get_all_subclasses(BaseEntity)]:
        cls._id = -1
