"""The request fields that constrain the output, by the names each API gives them:
OpenAI's response_format, vLLM's structured_outputs and its older guided_*, and
llama.cpp's grammar and json_schema; at most one per request."""
from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from ..structured import StructuredOutputs
from .api_model import APIModel


class JSONSchemaFormat(APIModel):
    """response_format's json_schema (the OpenAI SDK's parse() sends a Pydantic model's)."""
    name: str = "response"
    description: str | None = None
    schema_: dict | bool | None = Field(None, alias="schema")
    strict: bool | None = None  # the schema is always enforced, strict or not


class ResponseFormat(APIModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None
    # json_object with a schema: llama.cpp's server reads it (instructor's JSON_SCHEMA
    # mode sends it), and so do we: the object follows the schema
    schema_: dict | bool | None = Field(None, alias="schema")

    @model_validator(mode="after")
    def _schema_given(self):
        if self.type == "json_schema" and (self.json_schema is None
                                           or self.json_schema.schema_ is None):
            raise ValueError("type 'json_schema' needs json_schema.schema")
        return self


# the fields that constrain the output, by API: (field, StructuredOutputs' name for it)
CONSTRAINT_FIELDS = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice",
                     "guided_grammar": "grammar", "grammar": "grammar", "json_schema": "json"}


class ConstraintFields(APIModel):
    # structured outputs (at most one of these): OpenAI's response_format; vLLM's
    # structured_outputs ({"json" | "regex" | "choice" | "grammar" | "json_object": ...})
    # and its older guided_*; llama.cpp's grammar (GBNF) and json_schema
    response_format: ResponseFormat | None = None
    structured_outputs: dict | None = None
    guided_json: dict | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    grammar: str | None = None
    json_schema: dict | None = None

    def constraint_field(self) -> str | None:
        """The field that constrains the output (None: free text); ValueError when two do."""
        given = [name for name in ("response_format", "structured_outputs", *CONSTRAINT_FIELDS)
                 if getattr(self, name) is not None]
        if self.response_format is not None and self.response_format.type == "text":
            given.remove("response_format")
        if len(given) > 1:
            raise ValueError(f"{given[0]}: give one constraint, not {' and '.join(given)}")
        return given[0] if given else None

    def constraint(self) -> StructuredOutputs | None:
        """The output's constraint (None: free text); ValueError or TypeError naming the
        field for a bad one."""
        field = self.constraint_field()
        if field is None:
            return None
        try:
            if field == "response_format":
                fmt = self.response_format
                if fmt.type == "json_object":
                    if fmt.schema_ is not None:
                        return StructuredOutputs(json=fmt.schema_)
                    return StructuredOutputs(json_object=True)
                return StructuredOutputs(json=fmt.json_schema.schema_)
            if field == "structured_outputs":
                return StructuredOutputs(**self.structured_outputs)
            return StructuredOutputs(**{CONSTRAINT_FIELDS[field]: getattr(self, field)})
        except (ValueError, TypeError) as e:
            message = str(e).replace("__init__() got an unexpected keyword argument",
                                     "unknown key")
            raise ValueError(f"{field}: {message}") from None
