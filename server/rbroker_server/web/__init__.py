"""The private web view: sign-in sessions and server-rendered fleet and computer pages."""
