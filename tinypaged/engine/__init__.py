"""The engine: requests in, one step at a time. LLMEngine.step() is four calls:
Scheduler.schedule() (which sequences, prefill chunks or decodes; blocks from the
BlockManager), ModelRunner.run() (the forward pass over the batch), Sampler.sample()
and Postprocessor (tokens appended, stops, finished requests); StepOutcome keeps a
failure to the requests it touched. EngineLoop is the one thread that owns an
engine and that any number of callers share."""
