"""The crash campaign (scripts/crash_campaign.py) split by concern.

crash_campaign.py is only the entry point; what it does lives here:

  common     paths, client names, the -v progress log, log tails
  procs      subprocesses and mounts, and the registry that cleans them up
  daemon     the Canopy daemon (`canopy mount -f`) of one mount
  crash      how a round's crash happens: kill -9 of the daemon, or a power cut
  pgwire     a minimal PostgreSQL wire-protocol v3 client
  postgres   a PostgreSQL server (cluster) on the mount, and its log checks
  clients    the database workloads that record acknowledged commits
  helpers    the helper processes (`crash_campaign.py _child KIND CONFIG`)
  round      one round: one image through its crash cycles and checks
  report     the per-round line, the summary and the JSON summary
  cli        the command line and the campaign loop
"""
