"""Server readiness: 503 while loading, after a failed load, and once the engine has died."""

import pytest

from engine_lite.config import EngineConfig
from engine_lite.server.protocol import APIError
from engine_lite.server.state import ServerSettings, ServerState


def _status_and_message(state):
    with pytest.raises(APIError) as info:
        state.require_ready()
    return info.value.status, info.value.message


def test_not_ready_until_loaded_then_failed_engine_stays_503():
    state = ServerState(EngineConfig(), ServerSettings("m"))
    status, message = _status_and_message(state)
    assert status == 503 and "still loading" in message
    state.load_error = "model='x' is neither a preset nor an existing folder"
    assert _status_and_message(state) == (503, f"the model failed to load: {state.load_error}")
    state.mark_engine_failed("RuntimeError('boom')")
    status, message = _status_and_message(state)
    assert status == 503 and "restart the server" in message and "boom" in message
