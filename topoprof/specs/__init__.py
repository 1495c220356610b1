"""The shared definitions stage: what both the CLI side and the rank side must agree on, below
both: a collective's spec (`collective_spec`: counts, bus-bandwidth factors, a result row), FSDP2's
modes (`fsdp_modes`), the device profile's document (`profile_schema`), the host's facts as the
hardware reader fills them and a topology holds them (`host_facts`), and the typed jobs and
results that cross between the launcher and its rank workers with their codec (`messages`), the
pass on meta they carry and the predict stage reads (`traced_pass`), and
what a launcher and a shared fork server compare before it forks the launcher's ranks
(`fork_protocol`). It
gives names, dataclasses and pure functions; it imports nothing of topoprof but the base."""
