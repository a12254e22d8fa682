def panel_for_result(result, model):
    return {k: tuple(v.shape) if hasattr(v, "shape") else v for k, v in result.saved.items()}
