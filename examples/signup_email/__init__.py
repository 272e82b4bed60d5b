"""Signup with email confirmation: the user and the email's event commit together."""
