package doctest

import (
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"path"
	"slices"
	"strconv"
	"strings"
)

// packages are the import paths of the packages a fragment may use
// without importing them, by the name it uses them with. A fragment that
// uses another package imports it in the declarations it assumes.
var packages = map[string]string{
	"bytes":   "bytes",
	"context": "context",
	"errors":  "errors",
	"fmt":     "fmt",
	"http":    "net/http",
	"io":      "io",
	"log":     "log",
	"os":      "os",
	"signal":  "os/signal",
	"slog":    "log/slog",
	"strings": "strings",
	"sync":    "sync",
	"testing": "testing",
	"time":    "time",

	"chiroute":    "github.com/go-idempotency/idempotency/chiroute",
	"client":      "github.com/go-idempotency/idempotency/client",
	"idempotency": "github.com/go-idempotency/idempotency",
	"idemgrpc":    "github.com/go-idempotency/idempotency/grpc",
	"idemnats":    "github.com/go-idempotency/idempotency/brokers/nats",
	"idemotel":    "github.com/go-idempotency/idempotency/adapters/otel",
	"idemprom":    "github.com/go-idempotency/idempotency/adapters/prometheus",
	"idemrabbit":  "github.com/go-idempotency/idempotency/brokers/rabbitmq",
	"memstore":    "github.com/go-idempotency/idempotency/memstore",
	"natsink":     "github.com/go-idempotency/idempotency/brokers/nats/natsink",
	"outbox":      "github.com/go-idempotency/idempotency/outbox",
	"pgstore":     "github.com/go-idempotency/idempotency/pgstore",
	"redisstore":  "github.com/go-idempotency/idempotency/redisstore",
	"relay":       "github.com/go-idempotency/idempotency/outbox/relay",
	"replaycache": "github.com/go-idempotency/idempotency/replaycache",
	"servercheck": "github.com/go-idempotency/idempotency/servercheck",
	"sqlitestore": "github.com/go-idempotency/idempotency/sqlitestore",
	"state":       "github.com/go-idempotency/idempotency/state",
	"storetest":   "github.com/go-idempotency/idempotency/storetest",

	"amqp":        "github.com/rabbitmq/amqp091-go",
	"chi":         "github.com/go-chi/chi/v5",
	"codes":       "google.golang.org/grpc/codes",
	"credentials": "google.golang.org/grpc/credentials",
	"grpc":        "google.golang.org/grpc",
	"insecure":    "google.golang.org/grpc/credentials/insecure",
	"jetstream":   "github.com/nats-io/nats.go/jetstream",
	"metadata":    "google.golang.org/grpc/metadata",
	"nats":        "github.com/nats-io/nats.go",
	"pgx":         "github.com/jackc/pgx/v5",
	"pgxpool":     "github.com/jackc/pgx/v5/pgxpool",
	"prometheus":  "github.com/prometheus/client_golang/prometheus",
	"promhttp":    "github.com/prometheus/client_golang/prometheus/promhttp",
	"redis":       "github.com/redis/go-redis/v9",
	"status":      "google.golang.org/grpc/status",
	"trace":       "go.opentelemetry.io/otel/trace",
}

// source returns a file of package main that compiles s. A program (a
// snippet that starts with "package main") is compiled as it is. Any other
// snippet is a fragment, wrapped with the declarations it assumes and the
// imports of the packages it uses by their usual names (packages):
// declarations (functions, types, a block of imports) are put at the
// file's top level, beside an empty main; statements are put in main,
// followed by "_ = v" for each variable they declare, which the text
// around a fragment would go on to use. The imports of a fragment that
// holds nothing else are blank, so that they need not be used. Line
// directives give the snippet's lines their place in the Markdown file,
// so that errors point there.
func (s snippet) source() ([]byte, error) {
	if strings.HasPrefix(s.src, "package ") {
		if s.assumes != "" {
			return nil, errors.New("a whole program assumes nothing: declare what it needs in it")
		}
		return fmt.Appendf(nil, "//line %s:%d:1\n%s", s.file, s.line, s.src), nil
	}

	fset := token.NewFileSet()
	var imports []*ast.ImportSpec
	var assumed string // the assumed declarations other than imports
	if s.assumes != "" {
		f, err := parser.ParseFile(fset, "", "package main\n"+s.assumes, parser.ParseComments)
		if err != nil {
			return nil, fmt.Errorf("the assumed declarations do not parse: %v", err)
		}
		if err := s.checkNames(f); err != nil {
			return nil, err
		}
		imports = f.Imports
		assumed = afterImports(fset, f, s.assumes, s.file, s.assumesLine)
	}

	var body string
	if f, err := parser.ParseFile(fset, "", "package main\n"+s.src, parser.ParseComments); err == nil {
		// Declarations, at the top level.
		onlyImports := len(f.Imports) > 0 && len(f.Decls) == len(importDecls(f))
		for _, spec := range f.Imports {
			if onlyImports {
				spec = &ast.ImportSpec{Name: ast.NewIdent("_"), Path: spec.Path}
			}
			imports = append(imports, spec)
		}
		body = afterImports(fset, f, s.src, s.file, s.line)
		if !slices.ContainsFunc(f.Decls, isMain) {
			body += "\nfunc main() {}\n"
		}
	} else {
		// Statements, in main.
		f, err := parser.ParseFile(fset, "", "package main\nfunc main() {\n"+s.src+"\n}", 0)
		if err != nil {
			return nil, fmt.Errorf("the snippet parses neither as declarations nor as statements: %v", err)
		}
		var used strings.Builder
		for _, name := range declaredVars(f.Decls[0].(*ast.FuncDecl).Body) {
			fmt.Fprintf(&used, "\t_ = %s\n", name)
		}
		body = fmt.Sprintf("func main() {\n//line %s:%d:1\n%s%s}\n", s.file, s.line, s.src, used.String())
	}

	file := func(imports []*ast.ImportSpec) string {
		var b strings.Builder
		b.WriteString("package main\n\nimport (\n")
		for _, spec := range imports {
			b.WriteString("\t")
			if spec.Name != nil {
				b.WriteString(spec.Name.Name + " ")
			}
			b.WriteString(spec.Path.Value + "\n")
		}
		b.WriteString(")\n\n" + assumed + "\n" + body)
		return b.String()
	}
	for _, name := range undefined(file(imports)) {
		p, ok := packages[name]
		if ok && !slices.ContainsFunc(imports, func(spec *ast.ImportSpec) bool { return importName(spec) == name }) {
			// Named, for the packages whose name is not their path's
			// last element (amqp091-go's amqp091, used as amqp).
			imports = append(imports, &ast.ImportSpec{Name: ast.NewIdent(name), Path: &ast.BasicLit{Kind: token.STRING, Value: strconv.Quote(p)}})
		}
	}
	return []byte(file(imports)), nil
}

// checkNames checks that the summary of the assumed declarations f names
// what they declare: what the reader sees folded is what the test uses.
func (s snippet) checkNames(f *ast.File) error {
	var declared []string
	for _, spec := range f.Imports {
		declared = append(declared, importName(spec))
	}
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			declared = append(declared, d.Name.Name)
		case *ast.GenDecl:
			for _, spec := range d.Specs {
				switch spec := spec.(type) {
				case *ast.ValueSpec:
					for _, n := range spec.Names {
						declared = append(declared, n.Name)
					}
				case *ast.TypeSpec:
					declared = append(declared, spec.Name.Name)
				}
			}
		}
	}
	slices.Sort(declared)
	listed := slices.Sorted(slices.Values(s.names))
	if !slices.Equal(declared, listed) {
		return fmt.Errorf("the summary of the assumed declarations lists %v, and they declare %v", listed, declared)
	}
	return nil
}

// importName is the name an import declares: its own, or the one packages
// knows its path by, or the path's last element.
func importName(spec *ast.ImportSpec) string {
	if spec.Name != nil {
		return spec.Name.Name
	}
	p, _ := strconv.Unquote(spec.Path.Value)
	for name, known := range packages {
		if known == p {
			return name
		}
	}
	return path.Base(p)
}

// importDecls returns the import declarations of f.
func importDecls(f *ast.File) []*ast.GenDecl {
	var decls []*ast.GenDecl
	for _, d := range f.Decls {
		if g, ok := d.(*ast.GenDecl); ok && g.Tok == token.IMPORT {
			decls = append(decls, g)
		}
	}
	return decls
}

// isMain reports whether d declares the function main.
func isMain(d ast.Decl) bool {
	fn, ok := d.(*ast.FuncDecl)
	return ok && fn.Recv == nil && fn.Name.Name == "main"
}

// afterImports returns what src (parsed as f, after a one-line package
// clause) holds after its imports, with a line directive that gives it
// its place: src's first line is line first of the Markdown file.
func afterImports(fset *token.FileSet, f *ast.File, src, file string, first int) string {
	offset := 0
	line := 1
	if decls := importDecls(f); len(decls) > 0 {
		end := fset.Position(decls[len(decls)-1].End())
		offset = end.Offset - len("package main\n")
		line = end.Line - 1
	}
	return fmt.Sprintf("//line %s:%d:1\n%s", file, first+line-1, src[offset:])
}

// declaredVars returns the names of the variables that the statements of
// body declare at its top level.
func declaredVars(body *ast.BlockStmt) []string {
	var names []string
	add := func(id *ast.Ident) {
		if id.Name != "_" && !slices.Contains(names, id.Name) {
			names = append(names, id.Name)
		}
	}
	for _, stmt := range body.List {
		switch stmt := stmt.(type) {
		case *ast.AssignStmt:
			if stmt.Tok == token.DEFINE {
				for _, lhs := range stmt.Lhs {
					if id, ok := lhs.(*ast.Ident); ok {
						add(id)
					}
				}
			}
		case *ast.DeclStmt:
			if g, ok := stmt.Decl.(*ast.GenDecl); ok && g.Tok == token.VAR {
				for _, spec := range g.Specs {
					for _, id := range spec.(*ast.ValueSpec).Names {
						add(id)
					}
				}
			}
		}
	}
	return names
}

// undefined returns the names that src uses without declaring or
// importing them, found by the type checker (which knows scopes); the
// packages src imports are not read.
func undefined(src string) []string {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "", src, 0)
	if err != nil {
		return nil // the compiler will say what is wrong
	}
	var names []string
	conf := types.Config{
		Importer: unread{},
		Error: func(err error) {
			var te types.Error
			if errors.As(err, &te) {
				if name, ok := strings.CutPrefix(te.Msg, "undefined: "); ok && !slices.Contains(names, name) {
					names = append(names, name)
				}
			}
		},
	}
	conf.Check("main", fset, []*ast.File{f}, nil) // the errors are those above
	return names
}

// unread is an importer that reads no package: the type checker then
// declares each import as a package of unknown content, which is enough
// to tell an undefined name from an imported one.
type unread struct{}

func (unread) Import(path string) (*types.Package, error) {
	return nil, fmt.Errorf("%s is not read", path)
}
