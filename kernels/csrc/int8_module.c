/* The Python entry points of the integer-dot-product kernels' entry points (added to kernels._qmatmul by module.c). */
#include "qmatmul.h"

PyMethodDef int8_methods[] = {{NULL, NULL, 0, NULL}};
