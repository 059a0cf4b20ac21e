"""The simulator as a library: vLLM's scheduling policy over a KV-cache seam, engines a caller
steps, and one step model, with arrays in and tables out (no files).

- :mod:`.types`: the knobs vLLM's scheduler reads, a step's composition, the clock protocol;
- :mod:`.kv_cache`: how KV blocks are counted, allocated, cached and evicted
  (:class:`~.kv_cache.CountingKVCache`, :class:`~.kv_cache.PrefixKVCache`);
- :mod:`.engine`: vLLM's V1 scheduling policy, written once (:class:`~.engine.VllmV1Engine`);
- :mod:`.run`: one engine over a whole workload (:func:`~.run.run_v1`).
"""
