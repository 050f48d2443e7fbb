"""Without the ``storage`` extra: local repositories need nothing of it, and a URL is refused
naming the extra."""

from __future__ import annotations

import sys

import pytest

from sluice.errors import InvalidArgument
from sluice.repository.remote import plan_repositories
from sluice.repository.remote.credentials import Credentials
from sluice.repository.remote.stores import open_store
from sluice.repository.remote.url import parse_url


def test_a_url_without_obstore_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "obstore", None)  # import obstore raises ImportError
    monkeypatch.setitem(sys.modules, "obstore.store", None)
    paths, remotes = plan_repositories(["/models"], "/tmp/unused", {})
    assert [str(p) for p in paths] == ["/models"] and remotes == ()
    with pytest.raises(
        InvalidArgument, match=r"the 'storage' extra: pip install 'sluice\[storage\]'"
    ):
        open_store(parse_url("s3://bucket/models"), Credentials(), {}, 5.0)
