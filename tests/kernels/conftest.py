import pytest


@pytest.fixture(autouse=True)
def _default_tuning():
    """Each test starts and ends with the linear op's default tuning record (tests change it with
    ``microscale.linear.tuning.set_tuning``)."""
    from microscale.linear import tuning

    tuning.reset()
    yield
    tuning.reset()
