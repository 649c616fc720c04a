package pac

import (
	"time"

	"github.com/dop251/goja"
)

// goja computes a Date's local fields in the process's time.Local. The PAC sandbox
// must use the configured zone instead (UTC by default), whatever the host's zone is,
// so that every hop computes the same answer. Changing time.Local would change the
// whole daemon, so this shim replaces the zone-dependent parts of Date in each runtime:
// the local getters and setters, getTimezoneOffset, the string forms, and the
// constructor's year/month/... form. Date strings without an explicit zone
// (new Date("2026-01-02 10:00")) are still read in the host's zone: PAC files do not
// parse dates, and the time built-ins are native and always use the configured zone.

const dateZoneJS = `(function (D, off, fmt) {
	var P = D.prototype, getTime = P.getTime, setTime = P.setTime;
	function local(d) { var t = getTime.call(d); return t !== t ? NaN : t + off(t); }
	function toUTC(l) { if (l !== l) return NaN; return l - off(l - off(l)); }
	["FullYear", "Month", "Date", "Day", "Hours", "Minutes", "Seconds", "Milliseconds"].forEach(function (n) {
		var ug = P["getUTC" + n], us = P["setUTC" + n];
		Object.defineProperty(P, "get" + n, {configurable: true, writable: true, value: function () {
			var l = local(this); return l !== l ? NaN : ug.call(new D(l));
		}});
		if (n === "Day") return;
		Object.defineProperty(P, "set" + n, {configurable: true, writable: true, value: function () {
			var l = local(this);
			if (l !== l) { if (n !== "FullYear") { return setTime.call(this, NaN); } l = 0; }
			var d = new D(l);
			us.apply(d, arguments);
			return setTime.call(this, toUTC(getTime.call(d)));
		}});
	});
	Object.defineProperty(P, "getTimezoneOffset", {configurable: true, writable: true, value: function () {
		var t = getTime.call(this); return t !== t ? NaN : -off(t) / 60000;
	}});
	["toString", "toDateString", "toTimeString", "toLocaleString", "toLocaleDateString", "toLocaleTimeString"].forEach(function (n, i) {
		Object.defineProperty(P, n, {configurable: true, writable: true, value: function () {
			var t = getTime.call(this); return t !== t ? "Invalid Date" : fmt(t, i);
		}});
	});
	function Date(y, m) {
		if (!new.target) return fmt(D.now(), 0);
		switch (arguments.length) {
		case 0: return new D();
		case 1: return new D(y);
		}
		return new D(toUTC(D.UTC.apply(null, arguments)));
	}
	Object.defineProperty(Date, "length", {value: 7});
	Date.prototype = P;
	Object.defineProperty(P, "constructor", {configurable: true, writable: true, value: Date});
	Date.UTC = D.UTC; Date.now = D.now; Date.parse = D.parse;
	Object.defineProperty(globalThis, "Date", {configurable: true, writable: true, value: Date});
})`

var dateZoneProg = goja.MustCompile("kl-date-zone.js", dateZoneJS, true)

var dateLayouts = [...]string{
	"Mon Jan 02 2006 15:04:05 GMT-0700 (MST)",
	"Mon Jan 02 2006",
	"15:04:05 GMT-0700 (MST)",
	"01/02/2006, 15:04:05",
	"01/02/2006",
	"15:04:05",
}

func installDateZone(vm *goja.Runtime, loc *time.Location) error {
	if loc == time.Local {
		return nil // goja's own behaviour is already right
	}
	f, err := vm.RunProgram(dateZoneProg)
	if err != nil {
		return err
	}
	fn, _ := goja.AssertFunction(f)
	off := func(ms float64) float64 {
		_, o := time.UnixMilli(int64(ms)).In(loc).Zone()
		return float64(o) * 1000
	}
	format := func(ms float64, kind int) string {
		if kind < 0 || kind >= len(dateLayouts) {
			kind = 0
		}
		return time.UnixMilli(int64(ms)).In(loc).Format(dateLayouts[kind])
	}
	_, err = fn(goja.Undefined(), vm.Get("Date"), vm.ToValue(off), vm.ToValue(format))
	return err
}
