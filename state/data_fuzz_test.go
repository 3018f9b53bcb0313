package state

import (
	"encoding/json"
	"errors"
	"testing"
	"unicode/utf8"
)

// FuzzData: data is taken when it is JSON, UTF-8 and within the cap, and
// refused otherwise with an InvalidArgumentError of field data.
func FuzzData(f *testing.F) {
	f.Add([]byte(`{"amount":1999}`), 64)
	f.Fuzz(func(t *testing.T, data []byte, max int) {
		max = max & 0xff
		err := validData(data, max)
		want := max > 0 && len(data) > max || !utf8.Valid(data) || !json.Valid(data)
		var bad *InvalidArgumentError
		switch {
		case (err != nil) != want:
			t.Errorf("data %q, cap %d: %v, want refused %v", data, max, err, want)
		case err != nil && (!errors.As(err, &bad) || bad.Field != "data"):
			t.Errorf("data %q: %v, want an InvalidArgumentError of field data", data, err)
		}
	})
}
