"""HTTP routes: each converts the request and delegates (to params + dispatch)."""
