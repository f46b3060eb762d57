"""Who is asking: a viewer token or a computer's signed request, each scoped to one group."""
