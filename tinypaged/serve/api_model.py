"""APIModel: the base of every request body: strict types (a string is not a number),
null meaning a field's default, and fields this server does not know kept aside
(model_extra) and ignored."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, model_validator


class APIModel(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")

    @model_validator(mode="before")
    @classmethod
    def _null_is_the_default(cls, data):
        """null where a field has a default means that default (OpenAI's spec allows
        null for most optional fields, and its client sends temperature=None)."""
        if isinstance(data, dict):
            fields = cls.model_fields
            return {k: v for k, v in data.items()
                    if not (v is None and k in fields and not fields[k].is_required())}
        return data
