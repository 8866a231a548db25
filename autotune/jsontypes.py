"""The shape of what a JSON file holds: the values ``json.loads`` gives back and ``json.dumps`` writes.

A reader narrows a :data:`JsonValue` (``isinstance(data, dict)``) before it trusts a field; a writer's
``to_dict`` says it returns a :data:`JsonObject`, so a value JSON cannot hold is a type error there.
"""

from __future__ import annotations

from typing import TypeAlias

__all__ = ["JsonObject", "JsonScalar", "JsonValue"]

#: a JSON leaf: text, a number, true/false or null
JsonScalar: TypeAlias = str | int | float | bool | None
#: any JSON value: a leaf, an array of values or an object of values
JsonValue: TypeAlias = JsonScalar | list["JsonValue"] | dict[str, "JsonValue"]
#: a JSON object (``{...}``): what most of a study's files hold at their top
JsonObject: TypeAlias = dict[str, JsonValue]
