module github.com/skein-ml/skein

go 1.26
