"""retention: when a job's uploads and outputs were pruned

Revision ID: 0005_retention
Revises: 0001
"""
import sqlalchemy as sa
from alembic import op

revision = '0005_retention'
down_revision = '0003_batches'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('pruned_at', sa.DateTime(timezone=True), nullable=True))
    with op.batch_alter_table('outputs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('deleted_at', sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('outputs', schema=None) as batch_op:
        batch_op.drop_column('deleted_at')
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_column('pruned_at')
