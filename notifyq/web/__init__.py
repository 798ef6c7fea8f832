"""The status pages (`notifyq web`): server-rendered, read-only unless an actions token is set.

Needs the `web` extra (Jinja2); see docs/web.md.
"""
