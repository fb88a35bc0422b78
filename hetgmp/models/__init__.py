"""CTR models (WDL, DCN, DeepFM, DLRM) that take any embedding module as an argument."""

from hetgmp.models.ctr import DCN, DLRM, MODELS, WDL, CTRModel, DeepFM, build_model, model_class

__all__ = ["CTRModel", "DCN", "DLRM", "DeepFM", "MODELS", "WDL", "build_model", "model_class"]
