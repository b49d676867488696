"""`ddtree bench`: one report format for two kinds of target.

    config.py        the grid (SpecPoint), load points (LoadPoint), request settings
    sample.py        one prompt, one measured request (the clock rules)
    target.py        what a target is (and a run's bounds, to size it); implemented by
      openai_target.py   any OpenAI-compatible server (streaming, aiohttp)
      inprocess.py       the batched engine in this process, one per run
        engine_thread.py   the one thread that steps it
      hf_baseline.py     transformers' generate with a static cache
        serial.py          its one-at-a-time worker thread
    load.py          closed loop (N workers) and open loop (Poisson) load generators
    runner.py        warm-up, repeats, the grid, the progress bar
    metrics.py, row.py   percentiles, spreads, acceptance; a row and the =ar check
    table.py, sweep.py, report.py (+ schema.json), plots.py, compare.py   outputs
    environment.py   versions, GPU, git commit for the report
    workload.py      the prompt sets of a run (sources in ddtree/prompts.py)
"""
