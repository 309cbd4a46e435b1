import pytest

from tf_family.attention import native


@pytest.fixture(params=["native", "torch"])
def attention_backend(request, monkeypatch):
    """Run a test once with tf_family's native CPU attention kernel (forced: no calibration decides) and once with the
    PyTorch path it replaces."""
    if request.param == "torch":
        monkeypatch.setenv("TF_FAMILY_NATIVE", "0")
    elif native.extension() is None:
        pytest.skip("the native attention kernel could not be built here")
    else:
        monkeypatch.setenv("TF_FAMILY_NATIVE", "force")
    return request.param
