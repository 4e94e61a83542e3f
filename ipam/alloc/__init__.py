"""Address allocation, pure: pools and ranges, which addresses may be handed out, the policy that
picks one, and the planner that turns a choice into one store transaction."""
