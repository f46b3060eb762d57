"""What every route of the API shares: the one shape of an error answer (`answers`), the
checks of a read's query parameters (`query`) and the API's documentation with the errors it
declares (`docs`)."""
