package main

import (
	"fmt"
	"math"
	"strings"
)

// series is one line of a chart: y values at the chart's x values.
type series struct {
	name  string
	color string
	y     []float64 // NaN where there is no value
}

// panel is one chart: a log-scale x axis of key counts and a linear y axis
// starting at 0.
type panel struct {
	title, yLabel string
	x             []float64
	series        []series
}

// keyCountSVG draws the panels side by side, with no dependency beyond the
// standard library.
func keyCountSVG(title string, panels []panel) string {
	const pw, ph = 420.0, 300.0 // panel size
	const ml, mr, mt, mb = 64.0, 16.0, 48.0, 64.0
	width := float64(len(panels)) * (pw + ml + mr)
	height := ph + mt + mb
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%.0f" y="20" text-anchor="middle" font-size="15" font-weight="bold">%s</text>`+"\n", width/2, esc(title))
	for i, p := range panels {
		ox := float64(i)*(pw+ml+mr) + ml
		oy := mt
		ymax := 0.0
		for _, s := range p.series {
			for _, v := range s.y {
				if !math.IsNaN(v) {
					ymax = max(ymax, v)
				}
			}
		}
		ymax = niceCeil(ymax * 1.1)
		xmin, xmax := math.Log10(p.x[0]), math.Log10(p.x[len(p.x)-1])
		px := func(x float64) float64 { return ox + (math.Log10(x)-xmin)/(xmax-xmin)*pw }
		py := func(y float64) float64 { return oy + ph - y/ymax*ph }
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle" font-size="13" font-weight="bold">%s</text>`+"\n", ox+pw/2, oy-12, esc(p.title))
		// Grid and y ticks.
		for t := 0; t <= 5; t++ {
			y := ymax * float64(t) / 5
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", ox, py(y), ox+pw, py(y))
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end">%s</text>`+"\n", ox-6, py(y)+4, fmtNum(y))
		}
		for _, x := range p.x {
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", px(x), oy, px(x), oy+ph)
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">10^%.0f</text>`+"\n", px(x), oy+ph+18, math.Log10(x))
		}
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="none" stroke="#444"/>`+"\n", ox, oy, pw, ph)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">live records</text>`+"\n", ox+pw/2, oy+ph+36)
		fmt.Fprintf(&b, `<text transform="translate(%.1f %.1f) rotate(-90)" text-anchor="middle">%s</text>`+"\n", ox-48, oy+ph/2, esc(p.yLabel))
		for j, s := range p.series {
			var pts []string
			for k, v := range s.y {
				if math.IsNaN(v) {
					continue
				}
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(p.x[k]), py(v)))
				fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3.5" fill="%s"/>`+"\n", px(p.x[k]), py(v), s.color)
			}
			fmt.Fprintf(&b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="2"/>`+"\n", strings.Join(pts, " "), s.color)
			lx, ly := ox+float64(j)*150, oy+ph+54
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="2"/>`+"\n", lx, ly-4, lx+20, ly-4, s.color)
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f">%s</text>`+"\n", lx+26, ly, esc(s.name))
		}
	}
	b.WriteString("</svg>\n")
	return b.String()
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

func fmtNum(v float64) string {
	if v == math.Trunc(v) {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.1f", v)
}

func esc(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}
