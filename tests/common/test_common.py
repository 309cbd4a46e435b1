"""Every check of the common tester over every architecture of the registry."""

import pytest

from tf_family.registry import ARCHITECTURES

from .tester import ALL_CHECKS


@pytest.mark.parametrize("check", ALL_CHECKS, ids=lambda check: check.__name__.removeprefix("check_"))
@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_common(arch, check):
    check(ARCHITECTURES[arch])
