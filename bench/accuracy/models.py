"""Models of the accuracy study: the product's model resolver (:mod:`sim_models.models`)."""

from sim_models.models import FAMILIES, WHEELS, ModelSource, load, resolve, slug, wheel_gguf

__all__ = ["FAMILIES", "WHEELS", "ModelSource", "load", "resolve", "slug", "wheel_gguf"]
