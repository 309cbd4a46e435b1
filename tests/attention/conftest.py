import pytest

from tf_family.attention import backend, native


@pytest.fixture(params=["native", "torch"])
def attention_backend(request, monkeypatch):
    """Run a test once with tf_family's native CPU attention kernel (on every tile, whatever its rows) and once with
    the PyTorch path it replaces (`masked_attention`); the test calls the kernels with ``"tff_native"``."""
    if request.param == "torch":
        monkeypatch.setenv("TF_FAMILY_NATIVE", "0")
    elif native.extension() is None:
        pytest.skip("the native attention kernel could not be built here")
    else:
        monkeypatch.setattr(backend, "NATIVE_MIN_ROWS", 1)
    return request.param
