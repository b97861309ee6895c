"""Feature probes: a few cheap requests that find out what an upstream honours, rather than
assuming it. `chatgate probe` runs them against any URL; a deployment with `probe: true` runs
them against its replicas at start and on reload, and narrows its capabilities by the result.

- `findings`: the verdicts (honoured, deviates, ignored, refused, broken) and a run's report;
- `openai`, `azure`, `aleph_alpha`, `lmi`, `ovms`: each dialect's probe set (its requests, error
  shape and stream framing; the features it lacks), named in `sets`; `judges`: what they share;
- `runner`: sends a probe set to one URL;
- `narrowing`: findings → the deployment's capabilities, less what the upstream does not honour;
- `deployments`: the background probing of the deployments that ask for it.
"""
