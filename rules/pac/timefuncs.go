package pac

import (
	"errors"
	"math"
	"time"

	"github.com/dop251/goja"
)

// weekdayRange, dateRange and timeRange follow Mozilla's pac_utils.js (which Chromium
// and pacparser share), evaluated against the flow's timestamp in the configured zone,
// or in UTC when the last argument is "GMT". Names are upper case, as in the browsers.

var wdays = map[string]int{"SUN": 0, "MON": 1, "TUE": 2, "WED": 3, "THU": 4, "FRI": 5, "SAT": 6}

var months = map[string]int{"JAN": 0, "FEB": 1, "MAR": 2, "APR": 3, "MAY": 4, "JUN": 5,
	"JUL": 6, "AUG": 7, "SEP": 8, "OCT": 9, "NOV": 10, "DEC": 11}

func isGMT(v goja.Value) bool { return v != nil && v.String() == "GMT" }

// zoneArgs strips a trailing "GMT" and returns the time in the zone to use.
func zoneArgs(now time.Time, loc *time.Location, args []goja.Value) (time.Time, []goja.Value) {
	if n := len(args); n > 0 && isGMT(args[n-1]) {
		return now.UTC(), args[:n-1]
	}
	return now.In(loc), args
}

func lookup(m map[string]int, v goja.Value) int {
	if v == nil {
		return -1
	}
	if i, ok := m[v.String()]; ok {
		return i
	}
	return -1
}

func weekdayRange(now time.Time, loc *time.Location, all []goja.Value) bool {
	if len(all) == 0 {
		return false
	}
	t, args := zoneArgs(now, loc, all)
	wday := int(t.Weekday())
	// As in Mozilla: the first name is arguments[0] even when it is "GMT" itself.
	wd1 := lookup(wdays, all[0])
	wd2 := wd1
	if len(args) == 2 {
		wd2 = lookup(wdays, args[1])
	}
	if wd1 == -1 || wd2 == -1 {
		return false
	}
	if wd1 <= wd2 {
		return wd1 <= wday && wday <= wd2
	}
	return wd2 >= wday || wday >= wd1
}

// jsParseInt is parseInt(v) for the small integers PAC passes (day, year): leading
// whitespace, an optional sign, decimal digits; NaN when there are none.
func jsParseInt(v goja.Value) (int, bool) {
	s := v.String()
	i := 0
	for i < len(s) && isJSSpace(rune(s[i])) {
		i++
	}
	neg := false
	if i < len(s) && (s[i] == '+' || s[i] == '-') {
		neg = s[i] == '-'
		i++
	}
	n, d := 0, 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		if n < 1e8 {
			n = n*10 + int(s[i]-'0')
		}
		i++
		d++
	}
	if d == 0 {
		return 0, false
	}
	if neg {
		n = -n
	}
	return n, true
}

// dateRange accepts day, month and year arguments in the forms MDN documents:
// (day), (month), (year), (d1, d2), (m1, m2), (y1, y2), (d1, m1, d2, m2),
// (m1, y1, m2, y2), (d1, m1, y1, d2, m2, y2), each optionally followed by "GMT".
// A number below 32 is a day, otherwise a year. A range whose start is after its end
// wraps (OCT..MAR). Unknown month names and other odd argument lists give false.
//
// One deliberate difference from Mozilla's code: a range ending at a month ends on
// that month's last day. Mozilla sets the month on a Dec 31 date, so "FEB" as an end
// spills over to March 2 or 3; we keep the documented meaning.
func dateRange(now time.Time, loc *time.Location, all []goja.Value) bool {
	t, args := zoneArgs(now, loc, all)
	argc := len(args)
	if argc < 1 {
		return false
	}
	if argc == 1 {
		n, ok := jsParseInt(args[0])
		switch {
		case !ok:
			return int(t.Month())-1 == lookup(months, args[0])
		case n < 32:
			return t.Day() == n
		default:
			return t.Year() == n
		}
	}
	type end struct{ day, month, year int } // -1: not given
	parse := func(vals []goja.Value) (end, bool) {
		e := end{-1, -1, -1}
		for _, v := range vals {
			n, ok := jsParseInt(v)
			switch {
			case !ok:
				m := lookup(months, v)
				if m < 0 {
					return e, false
				}
				e.month = m
			case n < 32:
				e.day = n
			default:
				e.year = n
			}
		}
		return e, true
	}
	half := argc >> 1
	s, ok1 := parse(args[:half])
	e, ok2 := parse(args[half:])
	if !ok1 || !ok2 {
		return false
	}
	year, month := t.Year(), int(t.Month())-1
	y1, m1, d1 := year, 0, 1
	y2, m2, d2 := year, 11, -1
	if s.year >= 0 {
		y1 = s.year
	}
	if e.year >= 0 {
		y2 = e.year
	}
	if s.month >= 0 {
		m1 = s.month
	}
	if e.month >= 0 {
		m2 = e.month
	}
	if s.day >= 0 {
		d1 = s.day
	}
	if e.day >= 0 {
		d2 = e.day
	}
	if argc == 2 && s.day >= 0 && s.month < 0 && s.year < 0 {
		// (d1, d2): days of the current month.
		m1, m2 = month, month
	}
	z := t.Location()
	start := time.Date(y1, time.Month(m1+1), d1, 0, 0, 0, 0, z)
	var stop time.Time
	if d2 < 0 {
		// The last second of month m2: day 0 of the next month.
		stop = time.Date(y2, time.Month(m2+2), 0, 23, 59, 59, 0, z)
	} else {
		stop = time.Date(y2, time.Month(m2+1), d2, 23, 59, 59, 0, z)
	}
	cur := time.Date(t.Year(), t.Month(), t.Day(), t.Hour(), t.Minute(), t.Second(), 0, z)
	if !start.After(stop) {
		return !cur.Before(start) && !cur.After(stop)
	}
	return !stop.Before(cur) || !cur.Before(start)
}

var errTimeRangeArgs = errors.New("timeRange: bad number of arguments")

// timeRange: (hour) is that hour; (h1, h2) is h1 <= hour <= h2 and never wraps
// (timeRange(22, 2) is always false, as in every browser); (h1, m1, h2, m2) compares
// minutes and (h1, m1, s1, h2, m2, s2) seconds, both inclusive and wrapping past
// midnight when the start is after the end. 3, 5 or more than 6 arguments throw, as in
// Mozilla and Chromium, and so does "GMT" alone (none left once it is taken off): a
// script that expected an answer fails, and the call decides deny.
func timeRange(now time.Time, loc *time.Location, all []goja.Value) (bool, error) {
	t, args := zoneArgs(now, loc, all)
	argc := len(args)
	if len(all) < 1 {
		return false, nil
	}
	num := func(i int) float64 { return args[i].ToFloat() }
	hour := float64(t.Hour())
	switch argc {
	case 1:
		return hour == num(0), nil
	case 2:
		return num(0) <= hour && hour <= num(1), nil
	case 4, 6:
	default:
		return false, errTimeRangeArgs
	}
	for i := range args {
		if f := num(i); math.IsNaN(f) || math.IsInf(f, 0) {
			return false, nil
		}
	}
	ival := func(i int) int { return int(num(i)) }
	z := t.Location()
	var start, stop, cur time.Time
	if argc == 4 {
		start = time.Date(t.Year(), t.Month(), t.Day(), ival(0), ival(1), 0, 0, z)
		stop = time.Date(t.Year(), t.Month(), t.Day(), ival(2), ival(3), 0, 0, z)
		cur = time.Date(t.Year(), t.Month(), t.Day(), t.Hour(), t.Minute(), 0, 0, z)
	} else {
		start = time.Date(t.Year(), t.Month(), t.Day(), ival(0), ival(1), ival(2), 0, z)
		stop = time.Date(t.Year(), t.Month(), t.Day(), ival(3), ival(4), ival(5), 0, z)
		cur = time.Date(t.Year(), t.Month(), t.Day(), t.Hour(), t.Minute(), t.Second(), 0, z)
	}
	if !start.After(stop) {
		return !cur.Before(start) && !cur.After(stop), nil
	}
	return !stop.Before(cur) || !cur.Before(start), nil
}
