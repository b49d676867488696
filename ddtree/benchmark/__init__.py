"""`ddtree bench`: one report format for two kinds of target.

    config.py        the grid (SpecPoint), load points (LoadPoint), request settings
    sample.py        one prompt, one measured request (the clock rules)
    target.py        what a target is; implemented by
      openai_target.py   any OpenAI-compatible server (streaming, httpx)
      inprocess.py       the engine in this process (ddtree.engine.generate)
      hf_baseline.py     transformers' generate with a static cache
      serial.py          one-at-a-time worker thread for the in-process ones
    load.py          closed loop (N workers) and open loop (Poisson) load generators
    runner.py        warm-up, repeats, the grid, the progress bar
    metrics.py, row.py   percentiles, spreads, acceptance; a row and the =ar check
    table.py, sweep.py, report.py (+ schema.json), plots.py, compare.py   outputs
    environment.py   versions, GPU, git commit for the report
    workload.py      the prompt sets of a run (sources in ddtree/prompts.py)
"""
