"""A connector whose files name the wrong tokens: for a prompt starting with token id 7 the saved
`token_ids` have their last id changed, as an engine mixing up requests would. The cache server must
refuse such a file rather than store hidden states under the wrong prompt."""

from __future__ import annotations

import dataclasses
from typing import Any

from hsc_vllm_connector import HiddenStatesConnector

MARKER = 7


class WrongTokensConnector(HiddenStatesConnector):  # type: ignore[misc]
    """`HiddenStatesConnector` that corrupts `token_ids` of prompts whose first id is `MARKER`."""

    def _submit_async_write(self, pending: Any) -> None:
        ids = pending.token_ids
        if ids.numel() and int(ids[0]) == MARKER:
            ids = ids.clone()
            ids[-1] = (ids[-1] + 1) % self._vllm_config.model_config.get_vocab_size()
            pending = dataclasses.replace(pending, token_ids=ids)
        super()._submit_async_write(pending)
