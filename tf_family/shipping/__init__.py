"""Getting a trained model out: to the Hub (`hub`), with its model card (`cards`), as code plain transformers loads
with ``trust_remote_code=True`` (`remote_code`), and as an ONNX graph (`onnx_export`).

These modules read the registry and the models; no model imports them.
"""
