import numpy as np
import pytest

from mle_jax.env.improve_buffer import ImproveBuffer, PreviousSolution


def _sol(i: int, valid: bool = False) -> PreviousSolution:
    return PreviousSolution(
        plan=f"plan {i}",
        code=f"print({i})",
        output="loaded data",
        reward=-9.8,
        valid=valid,
        score=0.6 if valid else None,
        version=i,
    )


def test_keeps_only_solutions_that_got_somewhere_and_is_bounded():
    buf = ImproveBuffer(capacity=3)
    assert not buf.add(_sol(0), n_prints=0)  # printed nothing, not valid: nothing to improve on
    assert buf.add(_sol(1, valid=True), n_prints=0)
    for i in range(2, 6):
        assert buf.add(_sol(i), n_prints=2)
    assert len(buf) == 3
    seen = {buf.sample(np.random.default_rng(s)).version for s in range(50)}
    assert seen == {3, 4, 5}  # oldest evicted first


def test_state_round_trip_and_empty_sample():
    buf = ImproveBuffer(capacity=4)
    assert buf.sample(np.random.default_rng(0)) is None
    buf.add(_sol(7, valid=True), n_prints=3)
    again = ImproveBuffer.from_state_dict(buf.state_dict())
    assert again.sample(np.random.default_rng(0)) == _sol(7, valid=True)
    with pytest.raises(ValueError):
        ImproveBuffer(0)
