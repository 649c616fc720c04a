package pac

// ParseResult maps a FindProxyForURL return value to a route (SPEC §4.3).
func ParseResult(v string) Result {
	return Result{}
}
