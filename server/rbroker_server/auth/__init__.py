"""Who is asking: a viewer token or a computer's signed request, each scoped to one group;
the bearer secrets (viewer tokens, enrollment codes) are made and checked in `credentials`."""
