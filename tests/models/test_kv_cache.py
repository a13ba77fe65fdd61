"""KV page reservation on the host: batched reservations equal one-by-one ones, errors keep the table consistent; a
graph's padded entries (row 0) write only the dummy page."""

import pytest
import torch

from eaglet.kernels.kv_ops import step_slots
from eaglet.models.kv_cache import PAD_ROW, KVCache, KVPoolExhausted


def _cache(num_pages=40):
    kv = KVCache(1, 1, 4, max_reqs=3, max_context=64, page_size=4, num_pages=num_pages)
    return kv, [kv.alloc_request() for _ in range(3)]


def _table_matches_host(kv):
    for r, pages in kv._pages.items():
        assert kv.req_to_page[r, : len(pages)].tolist() == pages and not kv.req_to_page[r, len(pages):].any()


def test_reserve_many_equals_one_by_one():
    steps = [[(0, 5), (1, 9), (2, 1)], [(0, 5), (1, 13), (2, 17)], [(0, 30), (1, 13), (2, 18)]]
    one, rows = _cache()
    many, _ = _cache()
    for wants in steps:
        for r, n in wants:
            one.reserve(rows[r], n)
        many.reserve_many([(rows[r], n) for r, n in wants])
        assert torch.equal(one.req_to_page, many.req_to_page) and one._pages == many._pages
    _table_matches_host(many)


def test_pages_handed_out_before_an_error_reach_the_table():
    kv, rows = _cache(num_pages=8)  # 7 usable pages
    with pytest.raises(KVPoolExhausted, match="kv.num_pages"):
        kv.reserve_many([(rows[0], 8), (rows[1], 12), (rows[2], 20)])  # 2 + 3 pages, then 5 > 2 left
    assert [len(kv._pages[r]) for r in rows] == [2, 3, 0]
    _table_matches_host(kv)
    with pytest.raises(ValueError, match="context is 64"):
        kv.reserve_many([(rows[2], 4), (rows[0], 65)])
    assert len(kv._pages[rows[2]]) == 1
    _table_matches_host(kv)


def test_padded_entries_write_only_the_dummy_page():
    """cuda_graph.py zero-fills a bucket's padded entries, so inside a graph they carry row 0 and position 0: their
    slots (step_slots, as the plain decoding and the drafters find them in their graphs) must be the dummy page's,
    whatever the requests hold. With row 0 handed to a request, the padding wrote that request's first positions."""
    kv, rows = _cache()
    assert PAD_ROW not in rows and sorted(rows) == [1, 2, 3]
    with pytest.raises(KVPoolExhausted, match="all 3 are in use"):
        kv.alloc_request()
    kv.reserve_many([(r, 40) for r in rows])
    kv.free_request(rows[0])
    assert kv.alloc_request() == rows[0]  # a freed row comes back; row 0 never does
    assert not kv.req_to_page[PAD_ROW].any()
    pad = torch.zeros(2, dtype=torch.long)  # [2] the padded entries' rows
    _, _, slots = step_slots(kv.req_to_page, pad, torch.zeros(2, dtype=torch.int32), 6, kv.page_size)  # [2, 6]
    assert (slots // kv.page_size == 0).all()  # page 0: the dummy page
