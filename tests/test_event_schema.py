"""The event schema has one definition (``calltape.event_schema``) and every form is made from it.

The reference's table of types (docs/reference.md, SPEC section 1) is held to the Structs field by
field; the pydantic models at the public edge and the compiled check of the hot path are held to the
Structs; and ``events.py`` defines no data model of its own any more.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Annotated, Any, Literal, get_args, get_origin

import msgspec
import pytest
from pydantic import TypeAdapter

import calltape.events as events
from calltape.errors import InvalidEvent
from calltape.event_schema import SCHEMA, Data
from calltape.events import _COMPILED, DATA_MODELS, EVENT_TYPES, WireEvent, make_event, validate_data

ROOT = Path(__file__).resolve().parents[1]
ROW = re.compile(r"^\| `([a-z.]+)` \| (.+?) \| .+ \|$")


def _reference_table() -> dict[str, dict[str, tuple[bool, tuple[str, ...]]]]:
    """The reference's table of types: ``{type: {field: (optional, choices)}}``."""
    text = (ROOT / "docs" / "reference.md").read_text()
    section = text[text.index("| type | `data` |") :]
    section = section[: section.index("\n\n")]
    table: dict[str, dict[str, tuple[bool, tuple[str, ...]]]] = {}
    for line in section.splitlines()[2:]:
        found = ROW.match(line)
        assert found, line
        event_type, cell = found.groups()
        fields: dict[str, tuple[bool, tuple[str, ...]]] = {}
        for part in re.findall(r"`(\w+)(\?)?`( \([^)]*\))?", cell):
            name, optional, note = part
            choices = tuple(re.findall(r"`(\w+)`", note))
            fields[name] = (optional == "?", choices)
        table[event_type] = fields
    return table


def _literal_values(annotation: Any) -> tuple[str, ...] | None:
    """The choices of a ``Literal`` field (``Literal[...] | None`` too), else None."""
    if get_origin(annotation) is Literal:
        return tuple(get_args(annotation))
    for arg in get_args(annotation):
        if get_origin(arg) is Literal:
            return tuple(get_args(arg))
    return None


def test_every_type_in_the_reference_table_has_exactly_one_struct() -> None:
    table = _reference_table()
    assert set(table) == set(SCHEMA) == EVENT_TYPES == set(DATA_MODELS) == set(_COMPILED)
    for event_type, struct in SCHEMA.items():
        assert issubclass(struct, Data), event_type
        fields = {f.encode_name: f for f in msgspec.structs.fields(struct)}
        documented = table[event_type]
        assert set(fields) == set(documented), event_type
        for name, (optional, choices) in documented.items():
            assert fields[name].required is not optional, (event_type, name)
            literal = _literal_values(fields[name].type)
            if literal is not None:  # a closed set of values: the reference names the same ones
                assert set(literal) == set(choices), (event_type, name)


def _constraints(annotation: Any) -> tuple[Any, dict[str, Any]]:
    """A msgspec field type as its base type and its ``Meta`` constraints."""
    if get_origin(annotation) is not Annotated:
        return annotation, {}
    base, *metadata = get_args(annotation)
    found = {
        name: value
        for meta in metadata
        for name in ("gt", "ge", "lt", "le", "min_length", "max_length", "pattern")
        if (value := getattr(meta, name)) is not None
    }
    return base, found


@pytest.mark.parametrize("event_type", sorted(SCHEMA))
def test_the_edge_model_agrees_with_the_struct_field_by_field(event_type: str) -> None:
    struct, model = SCHEMA[event_type], DATA_MODELS[event_type]
    assert model.__name__ == f"{struct.__name__}Data" and model.__doc__ == struct.__doc__
    specs = msgspec.structs.fields(struct)
    assert list(model.model_fields) == [spec.name for spec in specs]
    for spec in specs:
        info = model.model_fields[spec.name]
        base, constraints = _constraints(spec.type)
        assert info.annotation == base, (event_type, spec.name)
        assert (info.alias or spec.name) == spec.encode_name, (event_type, spec.name)
        assert info.is_required() is spec.required, (event_type, spec.name)
        if not spec.required:
            assert info.default == spec.default, (event_type, spec.name)
        found = {name: getattr(item, name) for item in info.metadata for name in constraints if hasattr(item, name)}
        assert found == constraints, (event_type, spec.name)
    validated = {d.info.fields[0] for d in model.__pydantic_decorators__.field_validators.values()}
    assert validated == set(struct.checks), event_type


def test_events_py_defines_no_data_model_of_its_own() -> None:
    tree = ast.parse((ROOT / "calltape" / "events.py").read_text())
    models = [
        node.name
        for node in tree.body
        if isinstance(node, ast.ClassDef) and any(isinstance(b, ast.Name) and b.id == "_Data" for b in node.bases)
    ]
    assert models == ["ExtensionData"]  # any data at all: nothing to define
    for event_type, struct in SCHEMA.items():  # the exported names are the generated models
        name = f"{struct.__name__}Data"
        assert getattr(events, name) is DATA_MODELS[event_type], name


@pytest.mark.parametrize(
    ("event_type", "data"),
    [
        ("tool.call", {"call": "c", "name": "n", "arguments": "{bad"}),
        ("tool.call", {"call": "c", "name": "n", "arguments": 5}),
        ("session.resumed", {"agent": "a", "epoch": 0, "from_seq": 0}),
        ("session.redacted", {"kinds": ["card"], "spans": -1}),
        ("session.started", {"agent": "a", "modality": "video"}),
        ("agent.handoff", {"from_": "a", "to": "b"}),
        ("tool.effect", {"call": "c", "name": "n", "key": "k", "phase": "maybe"}),
    ],
)
def test_what_the_struct_refuses_the_model_refuses_with_its_sentence(event_type: str, data: dict[str, Any]) -> None:
    # the compiled check and the model are one schema: neither accepts what the other refuses
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert(data, SCHEMA[event_type], strict=False)
    with pytest.raises(InvalidEvent) as refused:
        make_event("s", event_type, data)
    message = str(refused.value)
    assert message.startswith(f"{event_type}: data '") and "\n" not in message
    with pytest.raises(InvalidEvent):
        validate_data(event_type, data)


def test_the_wire_union_still_has_a_json_schema() -> None:
    schema = TypeAdapter(WireEvent).json_schema()
    assert {"SessionStartedData", "ToolCallData", "AgentHandoffData"} <= set(schema["$defs"])
    assert "from" in schema["$defs"]["AgentHandoffData"]["properties"]
