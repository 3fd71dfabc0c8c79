"""The background writer of whole objects (the dataset's ConfigMaps): retried until done,
a newer operation under a key replaces one not yet started, refused ones are given up, and
never more than `concurrency` run at once."""

from __future__ import annotations

import asyncio

from mlsched.controller.kube.kube import KubeError
from mlsched.controller.kube.object_writer import ObjectWriter


def writer(**kw) -> ObjectWriter:
    failures = []
    w = ObjectWriter(backoff_s=0.001, max_backoff_s=0.01, rate=0,
                     on_failure=lambda: failures.append(1), **kw)
    w.failures = failures
    return w


def test_a_failing_write_is_retried_until_it_is_done():
    w, calls = writer(), []

    async def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise KubeError(503, "unavailable")

    async def main():
        w.submit("cm", flaky)
        return await w.flush(5)

    assert asyncio.run(main())
    assert len(calls) == 3 and len(w.failures) == 2 and w.pending() == 0


def test_a_write_the_api_server_refuses_is_given_up_not_repeated():
    w, calls = writer(), []

    async def invalid():
        calls.append(1)
        raise KubeError(422, "invalid")

    async def main():
        w.submit("cm", invalid)
        return await w.flush(5)

    assert asyncio.run(main())
    assert calls == [1] and w.pending() == 0


def test_a_newer_operation_replaces_one_not_yet_started():
    w, done = writer(), []

    def op(tag):
        async def run():
            done.append(tag)
        return run

    async def main():
        w.submit("cm", op("old"))  # queued: the task only starts at the first await
        w.submit("cm", op("new"))
        w.submit("other", op("other"))
        return await w.flush(5)

    assert asyncio.run(main())
    assert sorted(done) == ["new", "other"]


def test_at_most_concurrency_operations_run_at_once():
    w, running, most = writer(concurrency=2), [0], [0]

    async def slow():
        running[0] += 1
        most[0] = max(most[0], running[0])
        await asyncio.sleep(0.01)
        running[0] -= 1

    async def main():
        for i in range(6):
            w.submit(i, slow)
        return await w.flush(5)

    assert asyncio.run(main())
    assert most[0] == 2


def test_operations_submitted_without_a_loop_run_once_one_runs():
    w, done = writer(), []

    async def op():
        done.append(1)

    w.submit("cm", op)
    assert w.pending() == 1
    assert asyncio.run(w.flush(5)) and done == [1]
