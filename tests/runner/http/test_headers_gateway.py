"""The gateway's headers (runner/http/headers.py): the fairness id and the inference objective."""

from __future__ import annotations

import pytest

from runner.errors import ConfigError, InvalidHeader
from runner.floor.setting_texts import parse_objective_priorities
from runner.floor.settings import load_settings
from runner.http.headers import DEFAULT_OBJECTIVES, parse_request_headers

pytestmark = pytest.mark.timeout(10)

NEW_FAIRNESS = b"x-llm-d-inference-fairness-id"
OLD_FAIRNESS = b"x-gateway-inference-fairness-id"
NEW_OBJECTIVE = b"x-llm-d-inference-objective"
OLD_OBJECTIVE = b"x-gateway-inference-objective"


def test_gateway_fairness_id_is_read_from_one_header_only() -> None:
    """The llm-d fairness id is the gateway's tenant; its older name is not read at all
    (one header names the tenant); X-Tenant-ID stays absent."""
    meta = parse_request_headers([(NEW_FAIRNESS, b"t1")])
    assert meta.fairness_id == b"t1" and meta.tenant_header is None
    assert parse_request_headers([(OLD_FAIRNESS, b"t1")]).fairness_id is None
    both = [(OLD_FAIRNESS, b"old"), (NEW_FAIRNESS, b"new")]
    assert parse_request_headers(both).fairness_id == b"new"
    assert parse_request_headers(both[::-1]).fairness_id == b"new"


@pytest.mark.parametrize(
    "name", [NEW_FAIRNESS, b"x-tenant-id", b"authorization", b"x-quorum-gateway-secret"]
)
def test_gateway_repeated_identity_header_is_400(name: bytes) -> None:
    """An identity header sent twice is 400 invalid_header naming it: which copy a proxy
    overwrote is not the runner's to guess."""
    with pytest.raises(InvalidHeader) as info:
        parse_request_headers([(name, b"t1"), (name, b"t2")])
    assert name.decode().lower() in str(info.value).lower() and info.value.status == 400


@pytest.mark.parametrize(
    ("name", "value"),
    [(NEW_FAIRNESS, b"a/b"), (NEW_FAIRNESS, b""), (NEW_FAIRNESS, b"t" * 65)],
)
def test_gateway_invalid_fairness_id_is_400_naming_it(name: bytes, value: bytes) -> None:
    """A fairness id that would not be a valid X-Tenant-ID is 400 invalid_header naming it."""
    with pytest.raises(InvalidHeader) as info:
        parse_request_headers([(name, value)])
    assert name.decode() in str(info.value) and info.value.status == 400


@pytest.mark.parametrize(
    ("objective", "priority"),
    [
        (b"high", "high"),
        (b"normal", "normal"),
        (b"low", "low"),
        (b" Critical ", "high"),
        (b"standard", "normal"),
        (b"sheddable", "low"),
        (b"no-such-objective", "normal"),
    ],
)
@pytest.mark.parametrize("name", [NEW_OBJECTIVE, OLD_OBJECTIVE])
def test_gateway_objective_maps_to_priority(name: bytes, objective: bytes, priority: str) -> None:
    """The default table maps deploy/k8s' objectives and the old criticalities; unknown: normal."""
    assert parse_request_headers([(name, objective)]).priority == priority


def test_gateway_x_priority_wins_over_objective() -> None:
    """X-Priority, when present, decides whatever objective the gateway names."""
    raw = [(NEW_OBJECTIVE, b"high"), (b"x-priority", b"low")]
    assert parse_request_headers(raw).priority == "low"


def test_gateway_newer_objective_name_wins_over_older() -> None:
    """With both objective headers, the llm-d name decides."""
    raw = [(NEW_OBJECTIVE, b"low"), (OLD_OBJECTIVE, b"high")]
    assert parse_request_headers(raw).priority == "low"


def test_gateway_objective_table_is_the_one_given() -> None:
    """A table passed in (OBJECTIVE_PRIORITIES) replaces the default one."""
    table = parse_objective_priorities("Gold=high, bronze=low,")
    assert table == {b"gold": "high", b"bronze": "low"}
    assert parse_request_headers([(NEW_OBJECTIVE, b"gold")], table).priority == "high"
    assert parse_request_headers([(NEW_OBJECTIVE, b"high")], table).priority == "normal"


@pytest.mark.parametrize("text", ["gold", "gold=urgent", "=high", "gold=high,silver"])
def test_gateway_objective_table_refuses_bad_entries(text: str) -> None:
    """A malformed entry is refused, naming it."""
    with pytest.raises(ValueError, match="objective"):
        parse_objective_priorities(text)


def test_gateway_objective_setting_is_checked_at_start_up() -> None:
    """OBJECTIVE_PRIORITIES is read by the settings; a bad one is a ConfigError naming it."""
    assert load_settings({}).objectives == DEFAULT_OBJECTIVES
    custom = load_settings({"OBJECTIVE_PRIORITIES": "gold=high"})
    assert custom.objectives == {b"gold": "high"}
    with pytest.raises(ConfigError, match="OBJECTIVE_PRIORITIES"):
        load_settings({"OBJECTIVE_PRIORITIES": "gold=urgent"})
