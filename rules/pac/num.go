package pac

import (
	"math"
	"strconv"
)

// parseDecimal parses a string already checked to be a StrDecimalLiteral.
func parseDecimal(s string) float64 {
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		// Out of range: ParseFloat returns ±Inf with the error, which is JavaScript's answer.
		if ne, ok := err.(*strconv.NumError); ok && ne.Err == strconv.ErrRange {
			return f
		}
		return math.NaN()
	}
	return f
}
