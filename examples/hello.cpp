// The smallest miniflow program: a matrix product on the CPU. tests/examples.sh also runs it with the
// machine's CUDA libraries hidden, to show that a CUDA-enabled libminiflow needs none of them there.
#include <miniflow/miniflow.h>

#include <iostream>

int main() { std::cout << mf::ones({2, 3}).matmul(mf::full({3, 2}, 0.5)) << "\n"; }
