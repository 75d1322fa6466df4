"""The engine: requests in, one step at a time. LLMEngine.step() is four calls:
Scheduler.schedule() (a StepPlan: which sequences, prefill chunks or decodes; blocks
from the BlockManager), ModelRunner.run() (the forward pass; its tokens count as
computed), Sampler.sample() (prompt logprobs, forks, the tokens drawn) and
Postprocessor.postprocess() (tokens appended, stops, outputs); the plan's StepOutcome
keeps a failure to the requests it touched. EngineLoop is the one thread that owns an
engine and that any number of callers share."""
