"""Many callers, one engine: threads and asyncio tasks share the engine loop; cancels
free blocks; a failed step reaches exactly its callers; nothing ever hangs."""
import asyncio
import threading
import time

import numba
import pytest

from helpers import ctrl_c_while_waiting_for_output, step_gate, write_tiny_model
from serving import wait_until
from tinypaged import LLM, EngineDeadError, SamplingParams
from tinypaged.engine import step_logits

GREEDY = SamplingParams(temperature=0, max_tokens=20)
LONG = SamplingParams(temperature=0, max_tokens=400, ignore_eos=True)


@pytest.fixture(scope="module")
def stories(stories_dir):
    return LLM(stories_dir, backend="cpu", kv_cache_memory=16 << 20)


@pytest.fixture
def tiny(tmp_path):
    write_tiny_model(str(tmp_path / "tiny"), seed=7, max_position_embeddings=512)
    return LLM(tmp_path / "tiny", block_size=4, num_blocks=400)


def run_threads(targets):
    """Start every target at once (a barrier), join them; re-raise the first error."""
    barrier, errors = threading.Barrier(len(targets)), []

    def wrap(fn):
        try:
            barrier.wait()
            fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            errors.append(e)
    threads = [threading.Thread(target=wrap, args=(fn,)) for fn in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
        assert not t.is_alive(), "a caller hung"
    if errors:
        raise errors[0]


def test_32_threads_get_what_32_sequential_calls_get_and_share_steps(stories):
    prompts = [f"Once upon a time there was a {w}" for w in
               ("cat", "dog", "girl", "boy", "bird", "tree", "king", "frog")] * 4
    prompts = [p + "." * (i % 5) for i, p in enumerate(prompts)]  # 32 distinct prompts
    steps_before = stories.stats()["steps"]
    sequential = [stories.generate(p, GREEDY)[0] for p in prompts]
    sequential_steps = stories.stats()["steps"] - steps_before
    results = [None] * len(prompts)

    def caller(i):
        return lambda: results.__setitem__(i, stories.generate(prompts[i], GREEDY)[0])
    steps_before = stories.stats()["steps"]
    run_threads([caller(i) for i in range(len(prompts))])
    concurrent_steps = stories.stats()["steps"] - steps_before
    assert [r.token_ids for r in results] == [s.token_ids for s in sequential]
    assert [r.text for r in results] == [s.text for s in sequential]
    # one batch: the 32 requests ran side by side, not one after another
    assert concurrent_steps < sequential_steps / 4, (concurrent_steps, sequential_steps)
    assert stories.stats()["blocks_used"] == 0


def test_stream_chat_and_beam_search_from_threads_at_once(tiny):
    prompt, params = "the the", SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    alone_stream = "".join(tiny.stream(prompt, params))
    alone_generate = tiny.generate([[5, 6, 7]], params)[0].token_ids
    alone_beams = tiny.beam_search([8, 9, 10], beam_width=3, max_tokens=6)[0].beams
    alone_chat = tiny.chat([{"role": "user", "content": "hi"}], params)[0].text
    got = {}
    run_threads([
        lambda: got.__setitem__("stream", "".join(tiny.stream(prompt, params))),
        lambda: got.__setitem__("generate", tiny.generate([[5, 6, 7]], params)[0].token_ids),
        lambda: got.__setitem__("beams", tiny.beam_search([8, 9, 10], beam_width=3, max_tokens=6)[0].beams),
        lambda: got.__setitem__("chat", tiny.chat([{"role": "user", "content": "hi"}], params)[0].text),
    ] * 2)
    assert got["stream"] == alone_stream and got["generate"] == alone_generate
    assert [b.token_ids for b in got["beams"]] == [b.token_ids for b in alone_beams]
    assert got["chat"] == alone_chat
    assert tiny.stats()["blocks_used"] == 0


def test_beam_search_waits_for_running_requests_and_holds_new_ones(tiny):
    params = SamplingParams(temperature=0, max_tokens=60, ignore_eos=True)
    expected = tiny.generate([[3, 4, 5]], params)[0].token_ids
    handle = tiny.submit([3, 4, 5], params)  # running when the search is asked for
    beams = tiny.beam_search([8, 9], beam_width=4, max_tokens=5)[0]
    late = tiny.submit([3, 4, 5], params)  # arrives after: runs after the search
    assert handle.result().token_ids == expected == late.result().token_ids
    assert len(beams.beams) == 4 and tiny.stats()["blocks_used"] == 0


def test_asyncio_streams_run_concurrently_without_blocking_the_event_loop(stories):
    prompts = [f"Once upon a time {i}" for i in range(12)]
    params = SamplingParams(temperature=0, max_tokens=40)
    expected = [o.text for o in stories.generate(prompts, params)]

    async def main():
        ticks = 0
        done = asyncio.Event()

        async def ticker():
            nonlocal ticks
            while not done.is_set():
                await asyncio.sleep(0)
                ticks += 1

        async def one(prompt):
            return "".join([delta async for delta in stories.astream(prompt, params)])
        tick_task = asyncio.create_task(ticker())
        texts = await asyncio.gather(*(one(p) for p in prompts))
        outputs = await stories.agenerate(prompts, params)
        done.set()
        await tick_task
        return texts, [o.text for o in outputs], ticks
    texts, generated, ticks = asyncio.run(main())
    assert texts == expected and generated == expected
    assert ticks > 100  # the event loop kept running while the engine worked


def test_every_way_of_cancelling_frees_the_blocks(stories, monkeypatch):
    gate = step_gate(stories, monkeypatch)
    # closing a stream
    stream = stories.stream("Once upon a time", LONG)
    next(stream)
    stream.close()
    assert stories.stats()["blocks_used"] == 0
    # abort(request_id) from another thread, while this one waits for the result
    handle = stories.submit("Once upon a time", LONG)
    gate.close()

    def abort_while_held():  # (held: the request cannot finish first, however slow the machine)
        assert gate.reached.wait(300)
        stories.abort(handle.request_id)
        gate.open()
    threading.Thread(target=abort_while_held).start()
    out = handle.result()
    assert out.finished and out.finish_reason == "abort" and len(out.token_ids) < 400
    assert stories.stats()["blocks_used"] == 0
    # dropping the handle
    handle = stories.submit("Once upon a time", LONG)
    del handle
    assert stories.stats()["blocks_used"] == 0

    # cancelling the asyncio task that reads it
    async def cancel_one():
        async def read():
            async for _ in stories.astream("Once upon a time", LONG):
                pass
        task = asyncio.create_task(read())
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    asyncio.run(cancel_one())
    assert stories.stats()["blocks_used"] == 0
    assert stories.metrics().running == 0


def test_a_failed_step_reaches_every_caller_in_it_and_the_engine_goes_on(stories, monkeypatch):
    params = SamplingParams(temperature=0, max_tokens=60, ignore_eos=True)
    prompts = [f"Once upon a time {i}" for i in range(6)]
    expected = [o.token_ids for o in stories.generate(prompts, params)]
    runner, real_run, calls, in_failed_step = stories.engine.runner, stories.engine.runner.forward, [], set()

    def failing_run(batch, rows=None, needs=None, pooled=None):
        calls.append(1)
        if len(calls) == 3:
            in_failed_step.update(seq.request_id for seq, _ in batch.chunks)
            raise MemoryError("the device ran out of memory")
        return real_run(batch, rows, needs, pooled)
    monkeypatch.setattr(runner, "forward", failing_run)
    outcome = {}

    def caller(i):
        def call():
            try:
                outcome[f"c{i}"] = stories.submit(prompts[i], params, request_id=f"c{i}").result()
            except MemoryError as e:
                outcome[f"c{i}"] = e
        return call
    run_threads([caller(i) for i in range(len(prompts))])
    assert in_failed_step  # the failure hit some callers' requests ...
    for i in range(len(prompts)):
        got = outcome[f"c{i}"]
        if f"c{i}" in in_failed_step:  # ... each of them got the exception
            assert isinstance(got, MemoryError) and "ran out of memory" in str(got)
        else:  # ... and the others were untouched
            assert got.token_ids == expected[i]
    assert stories.stats()["blocks_used"] == 0
    assert stories.generate(prompts[0], params)[0].token_ids == expected[0]


def test_a_sampling_failure_fails_that_request_alone(stories, monkeypatch):
    good = stories.generate("Once upon a time", GREEDY)[0].token_ids
    broken = SamplingParams(temperature=0.5, seed=13, max_tokens=5)  # seed 13 marks it
    real_sample = step_logits.sample_tokens

    def sample_tokens(logits, params, *args):
        if any(p.seed == 13 for p in params):
            raise ValueError("Probabilities contain NaN")
        return real_sample(logits, params, *args)
    monkeypatch.setattr(step_logits, "sample_tokens", sample_tokens)
    got = {}

    def bad():
        with pytest.raises(ValueError):
            stories.generate("The dog", broken)
        got["bad"] = True
    run_threads([bad, lambda: got.__setitem__("good", stories.generate("Once upon a time", GREEDY)[0])])
    assert got["bad"] and got["good"].token_ids == good
    assert stories.stats()["blocks_used"] == 0


def test_an_interrupt_during_generate_aborts_its_requests(stories, monkeypatch, ctrl_c):
    gate = step_gate(stories, monkeypatch, closed=True)

    def interrupt_while_running():
        assert gate.reached.wait(300)  # both requests' first step waits at the gate,
        ctrl_c_while_waiting_for_output(threading.main_thread())  # and the caller for them
        gate.open()
    threading.Thread(target=interrupt_while_running).start()
    with pytest.raises(KeyboardInterrupt):
        stories.generate(["Once upon a time", "The dog"], LONG)
    assert stories.stats()["blocks_used"] == 0 and stories.num_waiting == 0
    assert stories.generate("Once upon a time", GREEDY)[0].text
    assert stories.metrics().finished["abort"] >= 2


def slow_llm_with_a_running_request(stories_dir, monkeypatch):
    """A fresh LLM, a long request under way, its started iterator (kept by the
    caller: dropping a started iterator aborts the request), and the closed gate that
    holds its next step (so it is still running whatever the machine's speed)."""
    llm = LLM(stories_dir, backend="cpu", kv_cache_memory=4 << 20)
    gate = step_gate(llm, monkeypatch)
    handle = llm.submit("Once upon a time", LONG)
    first = iter(handle)
    next(first)
    gate.close()
    return llm, handle, first, gate


def test_broken_bookkeeping_marks_the_engine_dead_for_everyone(stories_dir, monkeypatch):
    llm, handle, _first, gate = slow_llm_with_a_running_request(stories_dir, monkeypatch)

    def broken():
        raise AssertionError("ref count went negative")
    monkeypatch.setattr(llm.engine.scheduler, "schedule", broken)
    gate.open()
    with pytest.raises(EngineDeadError, match="ref count went negative"):
        handle.result()
    assert not llm.is_alive
    for call in (lambda: llm.generate("hi", GREEDY), llm.stats, lambda: llm.submit("hi")):
        with pytest.raises(EngineDeadError, match="create a new LLM"):
            call()


def test_close_ends_waiting_callers_and_later_calls(stories_dir, monkeypatch):
    llm, handle, _first, gate = slow_llm_with_a_running_request(stories_dir, monkeypatch)
    closer = threading.Thread(target=llm.close)
    closer.start()
    wait_until(lambda: not llm.is_alive)  # closed while its request waits at the gate
    gate.open()
    with pytest.raises(EngineDeadError, match="closed"):
        handle.result()
    closer.join()
    with pytest.raises(EngineDeadError):
        llm.generate("hi", GREEDY)


def test_request_ids_are_the_callers_to_choose_once(stories, monkeypatch):
    gate = step_gate(stories, monkeypatch, closed=True)  # it cannot finish before the abort
    handle = stories.submit("Once upon a time", LONG, request_id="mine")
    with pytest.raises(ValueError, match="'mine' is already in use"):
        stories.submit("The dog", GREEDY, request_id="mine")
    stories.abort("mine")
    gate.open()
    assert handle.result().finish_reason == "abort"
    stories.abort("mine")  # finished: ignored
    assert stories.submit("The dog", GREEDY, request_id="mine").result().finished


def test_stream_refuses_bad_input_at_the_call_and_n_over_one(stories):
    with pytest.raises(ValueError, match="prompt is empty"):
        stories.stream("", GREEDY)  # before any next()
    with pytest.raises(ValueError, match="n=3"):
        stories.stream("hi", SamplingParams(n=3))


def test_an_unreferenced_llm_is_collected_and_its_thread_ends_after_beam_search(tmp_path):
    """The loop thread kept its last command, whose closure held the LLM: an LLM that
    had run a beam search was never collected, and its thread never ended."""
    import gc
    import weakref

    write_tiny_model(str(tmp_path / "tiny"), seed=7, max_position_embeddings=512)
    llm = LLM(tmp_path / "tiny", block_size=4, num_blocks=400)
    llm.generate(["hello"], GREEDY)
    llm.beam_search(["hello"], beam_width=2, max_tokens=4)  # its last command: a closure
    thread, gone = llm._loop._thread, weakref.ref(llm)
    del llm
    gc.collect()
    thread.join(timeout=10)
    assert gone() is None and not thread.is_alive()


# -- queue bookkeeping (issue 18, A1 and A10) ---------------------------------------------

def test_aborting_waiting_requests_keeps_the_queue_in_order_and_counted(stories_dir):
    """Aborted waiting sequences leave the queue lazily, so an abort costs no scan of
    the queue; the others still run first come, first served, and the counts agree."""
    with LLM(stories_dir, backend="cpu", kv_cache_memory=4 << 20, max_num_seqs=1) as llm:
        engine = llm.engine
        params = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True, n=1)
        for i in range(300):
            engine.add_request([1, 5 + i % 50], params, request_id=f"r{i}")
        assert engine.scheduler.num_waiting == engine.scheduler.waiting_seats == 300
        for i in range(300):
            if i % 3:
                engine.abort(f"r{i}")
        scheduler = engine.scheduler
        assert scheduler.num_waiting == 100 and len(scheduler.waiting) < 300  # compacted
        order = []
        while engine.has_unfinished():
            order += [out.request_id for out in engine.step() if out.finished]
        assert order == [f"r{i}" for i in range(0, 300, 3)]
        assert scheduler.num_waiting == scheduler.waiting_seats == 0 and not scheduler.waiting
        assert engine.stats()["blocks_used"] == 0


def test_a_request_with_a_sample_preempted_counts_as_running_only(stories_dir):
    """/metrics' gauges: a request runs if any of its samples runs (A10: a request with
    one sample preempted was counted both running and waiting)."""
    with LLM(stories_dir, backend="cpu", kv_cache_memory=4 << 20) as llm:
        engine, loop = llm.engine, llm._loop
        engine.add_request([1, 5, 6], SamplingParams(n=2, temperature=1.0, max_tokens=50,
                                                     ignore_eos=True, seed=1), request_id="r")
        engine.step()  # the prompt, forked into two samples
        engine.scheduler._preempt(engine.scheduler.running[-1])
        loop._publish_state()
        metrics = llm.metrics()
        assert (metrics.running, metrics.waiting) == (1, 0)
        assert llm.num_waiting_samples == 1
        engine.abort("r")
        loop._publish_state()
        assert (llm.metrics().running, llm.metrics().waiting, llm.num_waiting_samples) == (0, 0, 0)


def test_waiting_samples_count_n_per_request(stories_dir):
    with LLM(stories_dir, backend="cpu", kv_cache_memory=4 << 20, max_num_seqs=2) as llm:
        params = SamplingParams(n=2, temperature=1.0, max_tokens=3, ignore_eos=True, seed=2)
        outputs = llm.generate([[1, 5], [1, 6], [1, 7]], params)
        assert all(len(out.outputs) == 2 for out in outputs)
        assert llm.num_waiting_samples == 0
        held = threading.Event()
        release = threading.Event()

        def hold_the_loop():
            held.set()
            release.wait()
        caller = threading.Thread(target=lambda: llm._loop.call(hold_the_loop))
        caller.start()
        held.wait()  # the loop thread is busy: adds queue up, counted with their n
        handles = [llm.submit([1, 8], params), llm.submit([1, 9], SamplingParams(max_tokens=2))]
        assert llm.num_waiting_samples == 3 and llm.num_waiting == 2
        release.set()
        caller.join()
        assert all(h.result().finished for h in handles)
        assert llm.num_waiting_samples == 0


# -- Ctrl+C in a finalizer (issue 18, C) ------------------------------------------------------

def spin() -> None:
    """Python bytecode for an interrupt sent again to be raised in (a minute at most:
    it comes within milliseconds)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        pass


@pytest.mark.parametrize("dropped", ["handle", "started iterator"])
def test_an_interrupt_landing_in_a_dropped_handle_is_raised_again(stories_dir, monkeypatch,
                                                                  dropped, ctrl_c):
    """Python drops an exception raised in __del__ or in a collected generator's
    cleanup; a Ctrl+C that lands while a dropped handle (or its started iterator)
    posts its abort must still reach the caller, and the abort still happen."""
    with LLM(stories_dir, backend="cpu", kv_cache_memory=4 << 20) as llm:
        gate = step_gate(llm, monkeypatch)
        handle = llm.submit("Once upon a time", LONG)
        if dropped == "started iterator":
            handle = iter(handle)  # (the generator holds the handle)
            next(handle)  # running
        gate.close()  # it cannot finish before the abort, however slow the machine
        real_abort, calls = llm._loop.abort, []

        def abort_interrupted_once(request_id):
            calls.append(request_id)
            if len(calls) == 1:
                raise KeyboardInterrupt  # as if SIGINT were handled right here
            real_abort(request_id)
        monkeypatch.setattr(llm._loop, "abort", abort_interrupted_once)
        with pytest.raises(KeyboardInterrupt):
            del handle
            spin()
        assert len(calls) == 2
        gate.open()
        monkeypatch.undo()
        assert llm.generate("Once upon a time", GREEDY)[0].finished  # the loop goes on
        assert llm.stats()["blocks_used"] == 0 and llm.metrics().finished["abort"] == 1


def test_an_interrupt_landing_in_a_collected_llm_is_raised_again(stories_dir, monkeypatch,
                                                                 ctrl_c):
    import gc

    llm = LLM(stories_dir, backend="cpu", kv_cache_memory=4 << 20)
    handle = llm.submit("Once upon a time", GREEDY)
    loop, stops = llm._loop, []
    real_stop = loop.stop

    def stop_interrupted_once():
        stops.append(True)
        if len(stops) == 1:
            raise KeyboardInterrupt
        real_stop()
    monkeypatch.setattr(loop, "stop", stop_interrupted_once)
    llm._finalizer = __import__("weakref").finalize(  # (re-armed with the patched stop)
        llm, __import__("tinypaged.interrupts").interrupts.finalize_keeping_interrupts, loop.stop)
    cycle = [llm]
    cycle.append(cycle)  # collected by the cyclic collector, wherever it runs
    del llm, cycle
    with pytest.raises(KeyboardInterrupt):
        gc.collect()
        spin()
    assert len(stops) == 2 and not loop.is_alive
    with pytest.raises(EngineDeadError):
        handle.result()


def test_a_lent_core_leaves_the_steps_one_thread_fewer_and_the_same_tokens(stories, monkeypatch):
    """EngineLoop.lend_core: while other CPU work runs (a grammar compile), the steps run
    on one numba thread fewer (at least one), and give the same tokens."""
    seen = []
    real = stories.engine.step

    def step():
        seen.append(numba.get_num_threads())
        return real()
    monkeypatch.setattr(stories.engine, "step", step)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=2)
    alone = stories.generate(["Once upon a time"], params)[0].outputs[0]
    full = seen[-1]
    with stories._loop.lend_core(), stories._loop.lend_core():
        lent = stories.generate(["Once upon a time"], params)[0].outputs[0]
        assert set(seen[-12:]) == {max(1, full - 2)}
    after = stories.generate(["Once upon a time"], params)[0].outputs[0]
    assert seen[-1] == full and full == numba.config.NUMBA_NUM_THREADS
    assert alone.token_ids == lent.token_ids == after.token_ids
    assert alone.token_logprobs == lent.token_logprobs == after.token_logprobs
