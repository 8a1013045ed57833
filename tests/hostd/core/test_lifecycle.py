"""A model version's lifecycle on a virtual clock: single-flight loads, backoff after failures, no room,
unloading and pinning. Time is a number the test passes; nothing sleeps."""

from __future__ import annotations

import pytest

from hostd.core.lifecycle import Action, IllegalTransition, Lifecycle, ModelState


def test_single_flight_two_waiters_one_load():
    life = Lifecycle()
    assert life.want(now=0.0) is Action.START_LOAD  # the first caller starts the load
    assert life.state is ModelState.LOADING
    assert life.want(now=0.1) is Action.WAIT_LOAD  # the second waits on it
    assert life.want(now=0.2) is Action.WAIT_LOAD
    life.loaded()
    assert life.want(now=1.0) is Action.SERVE and life.want(now=1.0) is Action.SERVE


def test_failed_load_backs_off_exponentially_capped():
    life = Lifecycle(backoff_base_s=1.0, backoff_cap_s=5.0)
    now, waits = 0.0, []
    for _ in range(5):
        assert life.want(now) is Action.START_LOAD
        retry_at = life.failed("boom", now)
        assert life.state is ModelState.FAILED and life.error == "boom"
        waits.append(retry_at - now)
        assert life.want(retry_at - 0.001) is Action.BACKOFF  # not before the backoff passes
        now = retry_at
    assert waits == [1.0, 2.0, 4.0, 5.0, 5.0]
    assert life.want(now) is Action.START_LOAD  # retried once the backoff passed
    life.loaded()
    assert (life.failures, life.error) == (0, "")


def test_an_explicit_load_retries_at_once():
    life = Lifecycle(backoff_base_s=10.0)
    life.want(0.0)
    life.failed("boom", 0.0)
    assert life.want(1.0) is Action.BACKOFF
    life.retry_now()
    assert life.want(1.0) is Action.START_LOAD


def test_no_room_goes_back_to_absent_and_may_retry_at_once():
    life = Lifecycle()
    assert life.want(0.0) is Action.START_LOAD
    life.no_room()
    assert life.state is ModelState.ABSENT and life.failures == 0
    assert life.want(0.0) is Action.START_LOAD  # no backoff: nothing was wrong with the model


def test_unload_waits_then_allows_a_new_load():
    life = Lifecycle()
    life.want(0.0)
    life.loaded()
    assert life.begin_unload() and life.state is ModelState.UNLOADING
    assert life.want(1.0) is Action.WAIT_UNLOAD
    life.unloaded()
    assert life.want(2.0) is Action.START_LOAD


def test_unloading_a_failed_model_forgets_the_failure():
    life = Lifecycle()
    life.want(0.0)
    life.failed("boom", 0.0)
    assert not life.begin_unload() and life.state is ModelState.ABSENT
    assert life.want(0.0) is Action.START_LOAD
    assert not Lifecycle().begin_unload()  # ABSENT: nothing to do


def test_pinning_is_part_of_the_lifecycle_and_survives_reloads():
    life = Lifecycle(pinned=True)
    life.want(0.0)
    life.loaded()
    life.begin_unload()
    life.unloaded()
    assert life.pinned


def test_illegal_transitions_raise():
    life = Lifecycle()
    with pytest.raises(IllegalTransition):
        life.loaded()  # ABSENT -> READY skips LOADING
    with pytest.raises(IllegalTransition):
        life.unloaded()


def test_model_state_old_import_path_is_the_core_enum():
    import hostd.model_state

    assert hostd.model_state.ModelState is ModelState
