"""Table tests of each dialect's translator, input → output, no server (in the manner of Envoy AI
Gateway's internal/translator/*_test.go): one module per dialect, the shared base in test_shape."""
