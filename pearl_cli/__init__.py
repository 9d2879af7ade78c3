"""`pearl`: the command-line client of the PEARL control plane. It talks to the REST API only (no Django
import), so it runs on any machine that can reach the server."""
