"""The node registry: node records and heartbeats (liveness), node options, the dead-node reaper
and the reclaim of what a dead node held."""
